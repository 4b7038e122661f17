"""docs/guides/ci.md runs as written: its setup, create and wait blocks, in bash with the real
curl and jq, against a real server (uvicorn in a thread, SQLite). The wait loop ends at each
final status with the right exit code, cancels the run on timeout, and an HTTP error stops the
script with the error's JSON body (its `code`) on stderr. The loop's final statuses are the run
lifecycle's (protocol/schemas.py TERMINAL_RUN_STATUSES)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.error_codes import ErrorCode
from protocol.schemas import RUN_STATUSES, TERMINAL_RUN_STATUSES
from tests.conftest import make_settings, mint_token
from tests.harness.serve import serve_in_thread

# integration: a server in a thread, bash, curl and jq as processes
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="curl, jq"),
]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "guides" / "ci.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```bash\n(.*?)```", GUIDE, re.S)
SETUP, CREATE, WAIT, BY_HAND = (
    next(b for b in BLOCKS if needle in b)
    for needle in ("api() {", "POST /api/v1/runs ", "deadline=", "cancel a run by hand")
)


class Server:
    def __init__(self, app: Any, url: str) -> None:
        self.app, self.url = app, url
        self.admin = mint_token(app, "admin", name="ci")

    def get(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.admin}"}
        return httpx.get(self.url + path, headers=headers, timeout=10).json()

    def create_run(self) -> str:
        config = json.loads((ROOT / "examples" / "runs" / "arithmetic.json").read_text())
        headers = {"Authorization": f"Bearer {self.admin}"}
        created = httpx.post(self.url + "/api/v1/runs", json=config, headers=headers, timeout=30)
        assert created.status_code == 201, created.text
        return str(created.json()["run"]["id"])

    def run_ids(self) -> set[str]:
        return {r["id"] for r in self.get("/api/v1/runs")}


@pytest.fixture(scope="module", name="ci_server")
def fixture_ci_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from server.app import create_app

    folder = tmp_path_factory.mktemp("ci")
    settings = make_settings(f"sqlite:///{folder / 'ci.db'}", folder / "bucket")
    application = create_app(settings, migrate=True)
    with serve_in_thread(application) as url:
        yield Server(application, url)


def _script(ci_server: Server, work: Path, *blocks: str, **env: str) -> subprocess.Popen[str]:
    """The guide's blocks as one bash script, run from the repository root (the examples' paths
    are relative to it), writing its files into `work`."""
    text = "\n".join(blocks).replace("> run.json", f"> {work}/run.json")
    text = text.replace("run.json)", f"{work}/run.json)")
    full_env = {"PATH": "/usr/bin:/bin", "AGR": ci_server.url, "ADMIN": ci_server.admin, **env}
    return subprocess.Popen(
        ["bash", "-c", text], cwd=ROOT, env=full_env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _created_run(ci_server: Server, before: set[str], script: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 30
    while not (new := ci_server.run_ids() - before):
        assert script.poll() is None, script.communicate()
        assert time.monotonic() < deadline, "the script created no run"
        time.sleep(0.05)
    (run_id,) = new
    return run_id


def _body(stderr: str) -> Any:
    """The error's JSON body, the last line of stderr (curl's own one-line reason before it)."""
    return json.loads(stderr.strip().splitlines()[-1])


def _move(ci_server: Server, run_id: str, transition: str) -> None:
    from server.db import transaction
    from server.runs import lifecycle

    with transaction(ci_server.app.state.sessionmaker) as session:
        if transition == "complete":
            lifecycle.complete(session, uuid.UUID(run_id), "test: the learner's final publish")
        else:
            lifecycle.admin_action(session, uuid.UUID(run_id), transition, "test")


def test_the_wait_loop_knows_the_final_statuses_of_the_lifecycle() -> None:
    cases = re.findall(r"^\s*([a-z_| ]+)\)", WAIT, re.M)
    listed = {s.strip() for case in cases for s in case.split("|")}
    assert listed == set(TERMINAL_RUN_STATUSES)
    comment = " ".join(WAIT.replace("#", " ").split())
    said = re.search(r"final: (.*?)\. The others \((.*?)\)", comment)
    assert said is not None, comment
    final, others = (set(re.findall(r"[a-z_]+", g)) - {"or"} for g in said.groups())
    assert final == set(TERMINAL_RUN_STATUSES)
    assert others == set(RUN_STATUSES) - TERMINAL_RUN_STATUSES


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("transition", "exit_code"), [("complete", 0), ("cancel", 1)])
def test_create_then_wait_until_a_final_status(
    ci_server: Server, tmp_path: Path, transition: str, exit_code: int
) -> None:
    before = ci_server.run_ids()
    script = _script(ci_server, tmp_path, SETUP, CREATE, WAIT, AGR_POLL_S="0.1")
    run_id = _created_run(ci_server, before, script)
    assert ci_server.get(f"/api/v1/runs/{run_id}")["status"] == "pending"
    assert script.poll() is None  # still waiting: pending is not final
    _move(ci_server, run_id, transition)
    out, err = script.communicate(timeout=60)
    assert script.returncode == exit_code, (out, err)
    assert f"run {run_id} created: its learner and workers serve smollm2-135m-instruct" in out
    if transition == "cancel":
        assert f"run {run_id} cancelled: test" in err


@pytest.mark.timeout(120)
def test_the_wait_loop_cancels_the_run_on_timeout(ci_server: Server, tmp_path: Path) -> None:
    before = ci_server.run_ids()
    script = _script(ci_server, tmp_path, SETUP, CREATE, WAIT, AGR_TIMEOUT_S="0")
    out, err = script.communicate(timeout=60)
    assert script.returncode == 1, (out, err)
    (run_id,) = ci_server.run_ids() - before
    assert f"run {run_id} still pending after 0 s: cancelling it" in err
    run = ci_server.get(f"/api/v1/runs/{run_id}")
    assert (run["status"], run["status_reason"]) == ("cancelled", "CI timeout")


@pytest.mark.timeout(60)
def test_an_http_error_stops_the_script_with_its_code(ci_server: Server, tmp_path: Path) -> None:
    """What -fsS hid: the body with its `code`. A wrong token and an invalid config."""
    script = _script(ci_server, tmp_path, SETUP, CREATE, ADMIN="agr_adm_not-a-token")
    out, err = script.communicate(timeout=30)
    assert script.returncode == 22 and _body(err)["code"] == ErrorCode.token_invalid, err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "no base model"}))
    create = CREATE.replace("examples/runs/arithmetic.json", str(bad))
    script = _script(ci_server, tmp_path, SETUP, create)
    out, err = script.communicate(timeout=30)
    answer = _body(err)
    assert script.returncode == 22 and answer["code"] == ErrorCode.validation_failed, err
    assert "base_model" in {e["field"] for e in answer["errors"]}


@pytest.mark.timeout(60)
def test_cancel_by_hand_and_a_registration_token(ci_server: Server, tmp_path: Path) -> None:
    run_id = ci_server.create_run()
    script = _script(ci_server, tmp_path, SETUP, BY_HAND, RUN=run_id)
    out, err = script.communicate(timeout=30)
    assert script.returncode == 0, (out, err)
    assert out.strip().splitlines()[-1].startswith("agr_reg_")
    run = ci_server.get(f"/api/v1/runs/{run_id}")
    assert (run["status"], run["status_reason"]) == ("cancelled", "not needed")
    again = _script(ci_server, tmp_path, SETUP, BY_HAND, RUN=run_id)
    out, err = again.communicate(timeout=30)
    assert again.returncode == 22 and _body(err)["code"] == ErrorCode.invalid_transition, err


def test_the_error_table_names_real_codes() -> None:
    table = GUIDE.split("## What a CI script does with each error")[1]
    named = set(re.findall(r"^\| (.*?) \|", table, re.M)) - {"code", "---"}
    codes = {c for cell in named for c in re.findall(r"`([a-z_]+)`", cell)}
    assert codes and codes <= {str(c) for c in ErrorCode}
