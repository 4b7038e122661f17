"""The learner's Tracker without a tracker service: which backend and names it resolves (the
learner's flags win over the run config), what it redacts, and that a failing tracker — an
import error, an init error, a log that raises or one that hangs — never reaches the caller:
one warning, mirroring off, every later call a no-op that returns at once."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from learner.config import LearnerSettings
from learner.tracking import Tracker
from learner.tracking import tracker as tracker_module
from learner.tracking.base import Kind
from learner.tracking.redact import REDACTED, redact
from learner.tracking.spec import TrackerSpec, resolve
from protocol.run_config import RunConfig
from tests.learner.tracking.support import RUN_ID, WEBHOOK, secret_config

pytestmark = [pytest.mark.timeout(60)]


def _settings(**kw: Any) -> LearnerSettings:
    return LearnerSettings(server_url="http://127.0.0.1:9", run_id=RUN_ID, token="t", **kw)


def _config(**tracking: Any) -> RunConfig:
    return RunConfig.model_validate(secret_config(**tracking))


# -- which tracker ---------------------------------------------------------------------------


def test_the_run_config_names_the_tracker_and_each_flag_wins() -> None:
    block = _config(backend="wandb", project="p", run_name="r", entity="team", tags=["a"]).tracking
    spec = resolve(_settings(), block, RUN_ID, "arith")
    assert spec == TrackerSpec("wandb", "p", "r", RUN_ID, "team", ("a",), None)
    flags = _settings(
        tracking_backend="mlflow",
        tracking_project="fp",
        tracking_run_name="fr",
        tracking_entity="fe",
        tracking_uri="sqlite:///x.db",
    )
    assert resolve(flags, block, RUN_ID, "arith") == TrackerSpec(
        "mlflow", "fp", "fr", RUN_ID, "fe", ("a",), "sqlite:///x.db"
    )


def test_defaults_without_a_block_and_none_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve(_settings(), None, RUN_ID, "arith") is None
    monkeypatch.setenv("ASYNCGRPO_LEARNER_TRACKING_BACKEND", "trackio")
    spec = resolve(_settings(), None, RUN_ID, "arith")
    assert spec is not None and (spec.backend, spec.project) == ("trackio", "asyncgrpo")
    assert spec.run_name == f"arith-{RUN_ID[:8]}"
    block = _config(backend="wandb").tracking
    assert resolve(_settings(tracking_backend="none"), block, RUN_ID, "arith") is None


def test_an_unknown_backend_flag_is_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match="tracking_backend"):
        _settings(tracking_backend="neptune")


# -- what it redacts -------------------------------------------------------------------------


def test_secret_fields_and_values_are_redacted_and_the_rest_kept() -> None:
    config = {
        "alarms": {"webhook_url": WEBHOOK, "stale_waste": 0.2},
        "sampling": {"max_new_tokens": 32},
        "grpo": {"micro_batch_tokens": 4096},
        "rewards": [
            {
                "name": "llm_judge",
                "kwargs": {
                    "url": "https://user:pw-secret@judge.example.com/v1/chat?key=q-secret",
                    "api_key_env": "JUDGE_KEY",
                    "headers": {"X-Custom": "h-secret"},
                    "model": "judge-1",
                    "note": "sk-live-abcdef123456",
                    "apiKey": "camel-secret",
                },
            }
        ],
        "dataset": {"kind": "hf", "path": "openai/gsm8k", "tok": "agr_lrn_abc"},
        "eval": None,
    }
    out = redact(config)
    assert out["alarms"] == {"webhook_url": REDACTED, "stale_waste": 0.2}
    assert out["sampling"] == {"max_new_tokens": 32}  # "tokens" is not "token"
    assert out["grpo"] == {"micro_batch_tokens": 4096}
    kwargs = out["rewards"][0]["kwargs"]
    assert kwargs["url"] == "https://redacted@judge.example.com/v1/chat?redacted"
    assert kwargs["api_key_env"] == REDACTED and kwargs["headers"] == REDACTED
    assert kwargs["note"] == REDACTED and kwargs["apiKey"] == REDACTED
    assert kwargs["model"] == "judge-1"
    assert out["dataset"] == {"kind": "hf", "path": "openai/gsm8k", "tok": REDACTED}
    assert out["eval"] is None
    assert "secret" not in repr(out) and "pw-" not in repr(out)


@pytest.mark.parametrize(
    "text",
    [
        "token agr_lrn_abcdef in the middle",
        "aws AKIAIOSFODNN7EXAMPLE here",
        "my key is sk-proj-abcdefghijklmnop1234",
        "pull with hf_abcdefghijklmnopqrst",
    ],
)
def test_a_key_inside_free_text_is_redacted(text: str) -> None:
    assert redact({"note": text}) == {"note": REDACTED}


def test_ordinary_text_is_kept() -> None:
    kept = {
        "system_prompt": "Think step by step; ask before you risk it.",
        "model": "qwen-judge-1",
        "risk_task": "mask-level",
    }
    assert redact(kept) == kept


# -- failures never reach training -----------------------------------------------------------


class _Recorder:
    """A backend that records (the interface's calls) and can fail or hang at one of them."""

    def __init__(self, fail_at: str = "", hang: threading.Event | None = None) -> None:
        self.fail_at, self.hang = fail_at, hang
        self.points: list[tuple[Kind, int, dict[str, float]]] = []
        self.config: dict[str, Any] = {}
        self.finished = False

    def start(self, spec: TrackerSpec, config: dict[str, Any]) -> None:
        if self.fail_at == "start":
            raise ConnectionError("cannot reach the tracking server")
        self.config = config

    def log(self, kind: Kind, step: int, values: dict[str, float]) -> None:
        if self.hang is not None:
            self.hang.wait()
        if self.fail_at == "log" and self.points:
            raise RuntimeError("log refused")
        self.points.append((kind, step, values))

    def finish(self) -> None:
        self.finished = True


def _tracker(backend: Any, name: str = "wandb") -> Tracker:
    return Tracker(_settings(tracking_backend=name), backends={name: lambda: backend})


def _wait(predicate: Any) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_points_are_prefixed_filtered_and_the_config_redacted() -> None:
    backend = _Recorder()
    tracker = _tracker(backend)
    tracker.start(RUN_ID, _config())
    tracker.log_step(3, 2, {"loss": 0.5, "bad": float("inf"), "flag": True, "text": "x"})
    tracker.log_eval(2, {"accuracy": 0.75, "pass_at_n": None, "n_samples": 4})
    tracker.close(5)
    assert backend.points == [
        ("train", 3, {"train/loss": 0.5, "train/version": 2.0}),
        ("eval", 2, {"eval/accuracy": 0.75, "eval/n_samples": 4.0}),
    ]
    assert backend.finished and backend.config["alarms"]["webhook_url"] == REDACTED
    tracker.start(RUN_ID, _config())  # a re-attach: still the one run, nothing restarted
    assert not tracker.active


def test_a_log_that_raises_turns_mirroring_off_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _Recorder(fail_at="log")
    tracker = _tracker(backend)
    tracker.start(RUN_ID, _config())
    with caplog.at_level(logging.WARNING, "learner.tracking"):
        for step in range(1, 6):
            tracker.log_step(step, step, {"loss": 1.0})
        _wait(lambda: tracker.failed is not None)
        tracker.log_step(6, 6, {"loss": 1.0})
        tracker.close(5)
    assert tracker.failed == "log: RuntimeError: log refused"
    assert [p[1] for p in backend.points] == [1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "training goes on without it" in warnings[0], warnings
    assert not backend.finished and not tracker.active


def test_an_init_error_and_a_missing_package_only_warn(caplog: pytest.LogCaptureFixture) -> None:
    refused = _tracker(_Recorder(fail_at="start"), "mlflow")
    refused.start(RUN_ID, _config())
    _wait(lambda: refused.failed is not None)
    assert refused.failed == "start: ConnectionError: cannot reach the tracking server"
    refused.log_step(1, 1, {"loss": 1.0})  # a no-op now

    class Missing(_Recorder):
        def start(self, spec: TrackerSpec, config: dict[str, Any]) -> None:
            import asyncgrpo_no_such_tracker_package  # noqa: F401

    missing = _tracker(Missing(), "trackio")
    with caplog.at_level(logging.WARNING, "learner.tracking"):
        missing.start(RUN_ID, _config())
        _wait(lambda: missing.failed is not None)
    assert "ModuleNotFoundError" in str(missing.failed)
    assert "pip install 'asyncgrpo[tracking-trackio]'" in caplog.text
    missing.close(1)


def test_a_hanging_tracker_never_blocks_and_drops_past_its_queue(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracker_module, "MAX_PENDING", 50)
    hang = threading.Event()
    tracker = _tracker(_Recorder(hang=hang))
    tracker.start(RUN_ID, _config())
    t0 = time.perf_counter()
    for step in range(200):
        tracker.log_step(step, 1, {"loss": 1.0})
    assert time.perf_counter() - t0 < 1.0
    assert tracker.dropped >= 200 - 50 - 1
    with caplog.at_level(logging.WARNING, "learner.tracking"):
        t0 = time.perf_counter()
        tracker.close(0.3)
        assert time.perf_counter() - t0 < 2.0
    assert "did not finish within" in caplog.text
    hang.set()


def test_without_a_tracker_every_call_is_a_no_op() -> None:
    tracker = Tracker(_settings())
    tracker.start(RUN_ID, _config())
    tracker.log_step(1, 1, {"loss": 1.0})
    tracker.log_eval(1, {"accuracy": 1.0})
    tracker.close()
    assert tracker.spec is None and not tracker.active and tracker.failed is None


@pytest.mark.integration  # a fresh interpreter
def test_no_tracker_package_is_imported_until_a_tracker_starts() -> None:
    import subprocess
    import sys

    code = (
        "import sys, learner.tracking, learner.tracking.tracker; "
        "print([m for m in ('wandb', 'trackio', 'mlflow') if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_attach_sends_tracking_only_when_set() -> None:
    """Learners from before the field refuse unknown fields: a run without a tracker hands them
    a config without it; one with a tracker hands the block over."""
    from protocol.run_config import LearnerRunConfig

    plain = _config().for_learner()
    assert "tracking" not in plain and LearnerRunConfig.model_validate(plain).tracking is None
    tracked = _config(backend="trackio", project="p").for_learner()
    assert tracked["tracking"]["backend"] == "trackio"
    block = LearnerRunConfig.model_validate(tracked).tracking
    assert block is not None and block.project == "p"


def test_close_waits_at_most_its_bound_even_with_a_full_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--tracking-close-s is the whole wait: a full queue must not add a second bound."""
    monkeypatch.setattr(tracker_module, "MAX_PENDING", 5)
    hang = threading.Event()
    tracker = _tracker(_Recorder(hang=hang))
    tracker.start(RUN_ID, _config())
    tracker.log_step(0, 1, {"loss": 1.0})
    _wait(lambda: tracker._queue.empty())  # the thread holds that point, hanging in log
    for step in range(1, 20):
        tracker.log_step(step, 1, {"loss": 1.0})
    assert tracker._queue.full()
    t0 = time.perf_counter()
    tracker.close(1.0)
    waited = time.perf_counter() - t0
    hang.set()
    assert 0.9 <= waited < 1.5, waited
