"""`asyncgrpo doctor worker|learner` against a real server (tests/harness/live_app.py) with the
small model: every check passes on a good setup, and each arranged fault (wrong token kind,
unreachable bucket, mismatched model and fingerprint, unreachable server) fails with its line
and exit code 1; `--json` parses and lists every check."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from asyncgrpo.cli import app
from server.db import transaction
from server.models import Run
from tests.conftest import mint_token
from tests.e2e.tcp_proxy import TcpProxy
from tests.harness.fixtures import live_s3, proxy
from tests.harness.live_app import LiveApp, live_app
from tests.s3_fixtures import free_port
from tests.server.learner.support import RunHandle, make_run

__all__ = ["live_s3", "proxy"]  # fixtures (tests/harness/fixtures.py)

# integration: a server in a thread, the real small model
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHECKS = [
    "server", "token", "version", "run", "bucket", "device", "dtype", "gpu memory", "torch",
    "transformers", "peft", "vllm", "model", "fingerprint",
]  # fmt: skip
LINE = re.compile(r"^(PASS|FAIL|SKIP) ([a-z ]+): (.*)$")


@pytest.fixture
def served(sqlite_url: str, tmp_path: Path, small_model_dir: str) -> Iterator[LiveApp]:
    """The app on SQLite, served; the small model converted before any doctor loads it."""
    with live_app(sqlite_url, tmp_path) as live:
        yield live


def _doctor(role: str, *args: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    """Exit code, {check: (status, rest of its line)}, stdout."""
    result = CliRunner().invoke(app, ["doctor", role, *args])
    lines = {}
    for text in result.stdout.splitlines():
        match = LINE.match(text)
        if match:
            lines[match[2]] = (match[1], match[3])
    return result.exit_code, lines, result.stdout


def _doctor_json(role: str, *args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["doctor", role, *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def _learner(live: LiveApp, run: RunHandle, token: str | None = None) -> list[str]:
    return ["--server", live.base, "--run", str(run.id), "--token", token or run.token]


def _worker(live: LiveApp, token: str, tmp: Path, *extra: str) -> list[str]:
    return ["--server", live.base, "--registration-token", token, "--state-dir", str(tmp), *extra]


def _set_fingerprint(live: LiveApp, run: RunHandle, fingerprint: str | None) -> None:
    with transaction(live.app.state.sessionmaker) as session:
        row = session.get(Run, run.id)
        assert row is not None
        row.tokenizer_fingerprint = fingerprint


def _learner_fingerprint(small_model_dir: str) -> str:
    """What the run's learner reports on attach (learner/loop.py): its tokenizer's fingerprint."""
    from lm.chat import tokenizer_fingerprint
    from lm.models import load_tokenizer

    return str(tokenizer_fingerprint(load_tokenizer(small_model_dir)))


def _good(lines: dict[str, tuple[str, str]]) -> None:
    """Every check passes; on a CPU host the GPU memory is skipped, and vLLM for a backend
    that does not use it."""
    assert list(lines) == CHECKS
    cpu_only = lines["device"][1].startswith("cpu")
    allowed = {"gpu memory": cpu_only, "vllm": True}
    skipped = {name for name, (status, _) in lines.items() if status == "SKIP"}
    assert all(allowed[name] for name in skipped), lines
    assert all(status != "FAIL" for status, _ in lines.values()), lines


@pytest.mark.slow  # loads the real small model
def test_a_good_learner_host_passes_every_check_and_json_lists_them(
    served: LiveApp, small_model_dir: str
) -> None:
    run = make_run(served.app)
    _set_fingerprint(served, run, _learner_fingerprint(small_model_dir))
    code, lines, out = _doctor("learner", *_learner(served, run))
    assert code == 0, out
    _good(lines)
    assert "equals the run's" in lines["fingerprint"][1]
    device = lines["device"][1]
    if device.startswith("cpu"):  # cuda absent or not asked: the line says which, and passes
        assert "cuda is not available here" in device or "CUDA GPU(s) also present" in device
    assert "read it back and deleted it" in lines["bucket"][1]
    code, document = _doctor_json("learner", *_learner(served, run))
    assert code == 0 and document["ok"] is True and document["role"] == "learner"
    assert [c["name"] for c in document["checks"]] == CHECKS
    assert set(document["checks"][0]) == {"name", "status", "detail", "fix"}
    assert served.app.state.store.list("probes/") == []  # each probe was cleaned up


@pytest.mark.slow  # loads the real small model
def test_a_mismatched_model_or_fingerprint_fails_its_line(
    served: LiveApp, small_model_dir: str, tmp_path: Path
) -> None:
    run = make_run(served.app)
    _set_fingerprint(served, run, "0" * 64)
    code, lines, out = _doctor("learner", *_learner(served, run))
    assert code == 1, out
    status, rest = lines["fingerprint"]
    assert status == "FAIL" and "fingerprint_mismatch" in rest and "— fix:" in rest
    assert {n for n, (s, _) in lines.items() if s == "FAIL"} == {"fingerprint"}
    # a worker serving the same files under another name is refused too (model_mismatch)
    registration = mint_token(served.app, "registration", name="w", max_uses=1)
    other_name = ("--model", small_model_dir, "--run", str(run.id))
    code, lines, out = _doctor("worker", *_worker(served, registration, tmp_path, *other_name))
    assert code == 1, out
    status, rest = lines["fingerprint"]
    assert status == "FAIL" and "model_mismatch" in rest
    assert "give --model smollm2-135m-instruct" in rest


@pytest.mark.slow  # loads the real small model
def test_a_good_worker_host_passes_with_its_registration_token(
    served: LiveApp, tmp_path: Path
) -> None:
    run = make_run(served.app)
    registration = mint_token(served.app, "registration", name="w", max_uses=2)
    args = _worker(served, registration, tmp_path, "--run", str(run.id))
    code, lines, out = _doctor("worker", *args)
    assert code == 0, out
    _good(lines)
    assert "2 of 2 uses left" in lines["token"][1]  # checking used none
    assert "none yet" in lines["fingerprint"][1]  # no learner has attached


@pytest.mark.slow  # loads the real small model
def test_a_pool_learner_host_presents_its_stored_pool_token_else_its_registration_token(
    served: LiveApp, tmp_path: Path, small_model_dir: str
) -> None:
    """As `asyncgrpo learner` without --run would (learner/pool.py): the pool token its
    credentials file holds for this server, or else the registration token it would register
    with; no run is named, so the run and fingerprint lines are skipped."""
    import httpx

    from learner.config import POOL_ID_FIELD
    from protocol import credentials

    registration = mint_token(served.app, "registration", name="pool", max_uses=2)
    creds = tmp_path / "pool.json"
    args = ["--server", served.base, "--credentials-file", str(creds)]
    code, lines, out = _doctor("learner", *args, "--registration-token", registration)
    assert code == 0, out
    assert "2 of 2 uses left" in lines["token"][1], lines["token"]
    assert lines["run"][0] == "SKIP" and lines["fingerprint"][0] == "SKIP", lines
    answer = httpx.post(
        f"{served.base}/api/v1/learners/register",
        headers={"Authorization": f"Bearer {registration}"},
        json={"name": "pool", "model": "smollm2-135m-instruct", "max_runs": 2,
              "tokenizer_fingerprint": _learner_fingerprint(small_model_dir)},
    )  # fmt: skip
    assert answer.status_code == 201, answer.text
    body = answer.json()
    stored = credentials.StoredCredential(body["learner_id"], body["learner_token"], served.base)
    credentials.save(creds, stored, POOL_ID_FIELD)
    code, lines, out = _doctor("learner", *args)
    assert code == 0, out
    status, rest = lines["token"]
    assert status == "PASS" and "pool_learner token agr_pln_" in rest, rest
    assert f"of pool learner {body['learner_id']}" in rest, rest


@pytest.mark.slow  # loads the real small model
def test_a_token_of_the_wrong_kind_fails_the_token_line_and_skips_what_needs_it(
    served: LiveApp, tmp_path: Path
) -> None:
    run = make_run(served.app)
    registration = mint_token(served.app, "registration", name="w")
    code, lines, out = _doctor("learner", *_learner(served, run, token=registration))
    assert code == 1, out
    status, rest = lines["token"]
    assert status == "FAIL" and "is a registration token" in rest and "learner token" in rest
    for name in ("version", "run", "bucket", "fingerprint"):
        assert lines[name][0] == "SKIP", lines[name]
    simulated = ("--backend", "simulated")  # no model to load: the token is the point here
    code, lines, out = _doctor("worker", *_worker(served, run.token, tmp_path, *simulated))
    assert code == 1, out
    status, rest = lines["token"]
    assert status == "FAIL" and "is a learner token" in rest and "registration token" in rest


def test_an_unreachable_bucket_fails_the_bucket_line(
    live_s3: LiveApp, proxy: TcpProxy, tmp_path: Path
) -> None:
    registration = mint_token(live_s3.app, "registration", name="w", max_uses=1)
    args = _worker(live_s3, registration, tmp_path, "--backend", "simulated")
    code, lines, out = _doctor("worker", *args)
    assert code == 0 and lines["bucket"][0] == "PASS", out  # S3 through the proxy
    assert live_s3.app.state.store.list("probes/") == []
    proxy.cut()
    code, lines, out = _doctor("worker", *args)
    assert code == 1, out
    status, rest = lines["bucket"]
    assert status == "FAIL" and f"PUT to {proxy.url} failed" in rest and "— fix:" in rest
    assert {n for n, (s, _) in lines.items() if s == "FAIL"} == {"bucket"}


def test_an_unreachable_server_fails_first_and_json_still_lists_every_check(
    tmp_path: Path, network_allowed: None
) -> None:
    base = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    args = ["--server", base, "--registration-token", "agr_reg_x", "--backend", "simulated",
            "--state-dir", str(tmp_path)]  # fmt: skip
    code, lines, out = _doctor("worker", *args)
    assert code == 1, out
    status, rest = lines["server"]
    assert status == "FAIL" and f"cannot reach {base}" in rest and "— fix:" in rest
    for name in ("token", "version", "run", "bucket"):
        assert lines[name][0] == "SKIP"
    code, document = _doctor_json("worker", *args)
    assert code == 1 and document["ok"] is False
    assert [c["name"] for c in document["checks"]] == CHECKS
    assert document["checks"][0]["status"] == "FAIL" and document["checks"][0]["fix"]


def test_a_setting_refused_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["doctor", "learner", "--server", "http://x"])
    assert result.exit_code == 2
    assert "error:" in result.output and "--run" in result.output


def test_cuda_asked_where_there_is_none_fails_the_device_line(
    tmp_path: Path, network_allowed: None
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the fault cannot be arranged")
    base = f"http://127.0.0.1:{free_port()}"
    common = ["--server", base, "--registration-token", "agr_reg_x", "--state-dir", str(tmp_path)]
    code, lines, out = _doctor("worker", *common, "--device", "cuda")
    assert code == 1, out
    status, rest = lines["device"]
    assert status == "FAIL" and "cuda is not available" in rest and "--device cpu" in rest
    for name in ("dtype", "gpu memory", "model", "fingerprint"):
        assert lines[name][0] == "SKIP", lines[name]
