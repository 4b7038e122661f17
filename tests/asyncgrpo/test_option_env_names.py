"""`asyncgrpo worker` and `asyncgrpo learner`: every command-line option is also an environment
variable named after it (ASYNCGRPO_WORKER_<OPTION>, ASYNCGRPO_LEARNER_<OPTION>), as
docs/guides/real-run.md says, including the options whose setting has another name (--server,
--threads, --run)."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from asyncgrpo.cli import app
from learner.config import LearnerSettings
from protocol.settings_env import setting_variables
from worker.config import WorkerSettings

COMMANDS = [
    ("worker", "ASYNCGRPO_WORKER_", WorkerSettings),
    ("learner", "ASYNCGRPO_LEARNER_", LearnerSettings),
]


def _long_options(command: str) -> list[str]:
    group: Any = typer.main.get_command(app)  # typer's click group
    params = group.commands[command].params
    options = [p for p in params if p.param_type_name == "option" and p.name != "help"]
    return [o for p in options for o in p.opts if o.startswith("--")]


@pytest.mark.parametrize(("command", "prefix", "settings"), COMMANDS)
def test_every_setting_is_an_option_of_its_environment_name(command, prefix, settings) -> None:  # type: ignore[no-untyped-def]
    """The options are the settings (nested groups included, e.g. --vllm-max-model-len for
    ASYNCGRPO_WORKER_VLLM_MAX_MODEL_LEN): one option name per environment name, no more."""
    long_names = _long_options(command)
    assert "--server" in long_names and "--threads" in long_names
    from_options = {prefix + o[2:].replace("-", "_").upper() for o in long_names}
    assert len(from_options) == len(long_names)
    under_prefix = {n for n in setting_variables(settings) if n.startswith(prefix)}
    assert from_options == under_prefix


def test_worker_reads_server_and_threads_under_both_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCGRPO_WORKER_SERVER", "http://by-option-name:1")
    monkeypatch.setenv("ASYNCGRPO_WORKER_THREADS", "3")
    settings = WorkerSettings()
    assert (settings.server_url, settings.num_threads) == ("http://by-option-name:1", 3)
    monkeypatch.delenv("ASYNCGRPO_WORKER_SERVER")
    monkeypatch.delenv("ASYNCGRPO_WORKER_THREADS")
    monkeypatch.setenv("ASYNCGRPO_WORKER_SERVER_URL", "http://by-field-name:2")
    monkeypatch.setenv("ASYNCGRPO_WORKER_NUM_THREADS", "5")
    settings = WorkerSettings()
    assert (settings.server_url, settings.num_threads) == ("http://by-field-name:2", 5)
    # the command line (field names) still wins over the environment
    assert WorkerSettings(server_url="http://cli:3", num_threads=7).num_threads == 7


def test_learner_reads_server_and_run_under_both_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCGRPO_LEARNER_SERVER", "http://by-option-name:1")
    monkeypatch.setenv("ASYNCGRPO_LEARNER_RUN", "run-a")
    monkeypatch.setenv("ASYNCGRPO_LEARNER_TOKEN", "agr_lrn_x")
    settings = LearnerSettings()
    assert (settings.server_url, settings.run_id) == ("http://by-option-name:1", "run-a")
    assert LearnerSettings(server_url="http://cli:2", run_id="run-b").run_id == "run-b"


def test_an_unknown_worker_variable_is_still_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("ASYNCGRPO_WORKER_SERVER_URL", "http://x:1")
    with pytest.raises(ValidationError):
        WorkerSettings(server="http://no-such-init-name:1")  # type: ignore[call-arg]


def _invoke(monkeypatch: pytest.MonkeyPatch, command: str, args: list[str]) -> tuple[Any, Any]:
    """`asyncgrpo <command> <args>` with the part's main replaced: (result, settings seen)."""
    from typer.testing import CliRunner

    import learner.main
    import worker.main

    seen: list[Any] = []
    part = worker.main if command == "worker" else learner.main
    monkeypatch.setattr(part, "main", lambda settings: seen.append(settings) or 0)
    result = CliRunner().invoke(app, [command, *args])
    return result, seen[-1] if seen else None


def test_the_worker_flags_of_before_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    args = [
        "--server", "http://h:1", "--registration-token", "agr_reg_x", "--name", "w1",
        "--gpu-type", "A10G", "--price-per-hour", "0.75", "--backend", "simulated",
        "--model", "some/model", "--token-file", "/tmp/t.json", "--threads", "3",
        "--max-inflight-sequences", "17", "--max-leases", "5",
    ]  # fmt: skip
    result, settings = _invoke(monkeypatch, "worker", args)
    assert result.exit_code == 0, result.output
    got = settings.model_dump(include={"server_url", "registration_token", "name", "gpu_type",
                                       "price_per_hour", "backend", "model", "num_threads",
                                       "max_inflight_sequences", "max_leases"})  # fmt: skip
    assert got == {
        "server_url": "http://h:1", "registration_token": "agr_reg_x", "name": "w1",
        "gpu_type": "A10G", "price_per_hour": 0.75, "backend": "simulated",
        "model": "some/model", "num_threads": 3, "max_inflight_sequences": 17, "max_leases": 5,
    }  # fmt: skip
    assert str(settings.token_file) == "/tmp/t.json"


def test_the_learner_flags_of_before_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    args = [
        "--server", "http://h:1", "--run", "r1", "--token", "agr_lrn_x", "--model", "m",
        "--threads", "2", "--device", "cuda:1", "--dtype", "bfloat16", "--work-dir", "/tmp/w",
        "--max-versions", "4", "--no-overlap", "--checkpoint-every-versions", "3",
        "--reward-module", "a.b", "--reward-module", "c", "--tracking-backend", "mlflow",
        "--tracking-project", "p", "--tracking-run-name", "n", "--tracking-entity", "e",
        "--tracking-uri", "sqlite:///m.db", "--collective-timeout-s", "7.5", "--fsdp",
    ]  # fmt: skip
    result, settings = _invoke(monkeypatch, "learner", args)
    assert result.exit_code == 0, result.output
    assert settings.model_dump(exclude={"work_dir"}) == {
        **LearnerSettings(server_url="http://h:1", run_id="r1", token="agr_lrn_x").model_dump(
            exclude={"work_dir"}
        ),
        "server_url": "http://h:1", "run_id": "r1", "token": "agr_lrn_x", "model": "m",
        "threads": 2, "device": "cuda:1", "dtype": "bfloat16", "max_versions": 4,
        "overlap": False, "checkpoint_every_versions": 3, "reward_modules": ["a.b", "c"],
        "tracking_backend": "mlflow", "tracking_project": "p", "tracking_run_name": "n",
        "tracking_entity": "e", "tracking_uri": "sqlite:///m.db", "collective_timeout_s": 7.5,
        "fsdp": True,
    }  # fmt: skip
    assert str(settings.work_dir) == "/tmp/w"
    result, settings = _invoke(monkeypatch, "learner", [*args[:6], "--overlap", "--no-fsdp"])
    assert (settings.overlap, settings.fsdp) == (True, False)


def test_the_command_line_wins_and_the_environment_fills_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASYNCGRPO_WORKER_SERVER_URL", "http://from-env:1")
    monkeypatch.setenv("ASYNCGRPO_WORKER_GPU_TYPE", "L4")
    monkeypatch.setenv("ASYNCGRPO_WORKER_ACQUIRE_WAIT_S", "2.5")
    monkeypatch.setenv("ASYNCGRPO_WORKER_VLLM_ENFORCE_EAGER", "false")
    monkeypatch.setenv("ASYNCGRPO_WORKER_VLLM_MAX_LORAS", "3")
    args = ["--gpu-type", "H100", "--vllm-max-loras", "5", "--simulated-step-s", "0.5"]
    result, settings = _invoke(monkeypatch, "worker", args)
    assert result.exit_code == 0, result.output
    assert (settings.server_url, settings.gpu_type, settings.acquire_wait_s) == (
        "http://from-env:1", "H100", 2.5,
    )  # fmt: skip
    # a group's option given on the command line keeps its other fields' environment values
    assert (settings.vllm.max_loras, settings.vllm.enforce_eager) == (5, False)
    assert settings.simulated.step_s == 0.5


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--gpu-count", "0"], "gpu_count: Input should be greater than or equal to 1"),
        (["--vllm-max-model-len", "0"], "vllm.max_model_len: Input should be greater than 0"),
        (["--environment-modules", "os system"], "not a dotted module path"),
    ],
)
def test_a_refused_option_is_one_line_and_exit_2(monkeypatch, args, reason) -> None:  # type: ignore[no-untyped-def]
    result, settings = _invoke(monkeypatch, "worker", ["--server", "http://h:1", *args])
    assert (result.exit_code, settings) == (2, None)
    assert reason in result.output and len(result.output.strip().splitlines()) == 1


def test_the_server_settings_under_the_part_prefixes_are_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ASYNCGRPO_LEARNER_LEASE_TTL_S is the server's (a shared environment holds it; the server
    has no setting under the worker's prefix any more); a real setting of the prefix is no
    unknown name."""
    monkeypatch.setenv("ASYNCGRPO_LEARNER_LEASE_TTL_S", "60")
    monkeypatch.setenv("ASYNCGRPO_WORKER_SIMULATED_STEP_S", "0.5")
    monkeypatch.setenv("ASYNCGRPO_LEARNER_OUTBOUND_ALLOW_PRIVATE", "true")
    assert WorkerSettings(server_url="http://h:1").simulated.step_s == 0.5
    learner = LearnerSettings(server_url="http://h:1", run_id="r", token="t")
    assert learner.outbound_allow_private is True


def test_a_missing_setting_names_its_option_and_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    result, settings = _invoke(monkeypatch, "learner", ["--run", "r1", "--token", "agr_lrn_x"])
    assert (result.exit_code, settings) == (2, None)
    assert (
        "server_url: Field required (give --server or --server-url, or set "
        "ASYNCGRPO_LEARNER_SERVER_URL or ASYNCGRPO_LEARNER_SERVER)" in result.output
    )
    assert "run_id" not in result.output and len(result.output.strip().splitlines()) == 1
    # --token is optional (a pool learner has none) but goes with --run
    half, settings = _invoke(monkeypatch, "learner", ["--server", "http://h:1", "--run", "r1"])
    assert (half.exit_code, settings) == (2, None)
    assert "--token is missing: --run and --token go together" in half.output
    assert len(half.output.strip().splitlines()) == 1
