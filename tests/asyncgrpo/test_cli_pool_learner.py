"""`asyncgrpo learner` as a pool learner (docs/guides/pool-learners.md): exactly one of --run
with --token, or a registration token (or this server's stored pool credential); --max-runs
out of its range or with --run, and torchrun, are refused with the reason, never a traceback."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from learner.config import POOL_ID_FIELD, LearnerSettings
from protocol import credentials
from protocol.schemas_learner import MAX_POOL_RUNS

SERVER = "http://h:8000"


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[LearnerSettings]:
    import learner.main

    for name in list(__import__("os").environ):
        if name.startswith("ASYNCGRPO_"):
            monkeypatch.delenv(name)
    got: list[LearnerSettings] = []
    monkeypatch.setattr(learner.main, "main", lambda settings: got.append(settings) or 0)
    return got


def _invoke(*args: str) -> Any:
    from asyncgrpo.cli import app

    return CliRunner().invoke(app, ["learner", "--server", SERVER, *args])


def test_a_learner_needs_a_run_or_a_registration_token(
    seen: list[LearnerSettings], tmp_path: Path
) -> None:
    creds = tmp_path / "pool.json"
    nothing = _invoke("--credentials-file", str(creds))
    assert nothing.exit_code == 2 and "give --run with --token" in nothing.output, nothing.output
    assert "Traceback" not in nothing.output
    half = _invoke("--run", "r", "--credentials-file", str(creds))
    assert half.exit_code == 2 and "--token is missing" in half.output, half.output
    both = _invoke("--run", "r", "--token", "agr_lrn_x", "--registration-token", "agr_reg_x")
    assert both.exit_code == 2 and "--registration-token is for a pool learner" in both.output
    assert seen == []
    pool = _invoke("--registration-token", "agr_reg_x", "--credentials-file", str(creds))
    assert pool.exit_code == 0, pool.output
    assert seen[-1].pool and seen[-1].pool_credentials_path() == creds
    # a stored credential for this server stands for the registration token; another's does not
    credentials.save(creds, credentials.StoredCredential("id", "agr_pln_x", SERVER), POOL_ID_FIELD)
    assert creds.stat().st_mode & 0o777 == 0o600
    assert _invoke("--credentials-file", str(creds)).exit_code == 0
    other = _invoke("--credentials-file", str(creds), "--server", "http://elsewhere:1")
    assert other.exit_code == 2 and "no pool learner credential" in other.output
    assert len(seen) == 2


def test_max_runs_is_a_pool_learners_and_max_versions_a_per_run_learners(
    seen: list[LearnerSettings], tmp_path: Path
) -> None:
    for bad in ("0", str(MAX_POOL_RUNS + 1)):
        out = _invoke("--registration-token", "agr_reg_x", "--max-runs", bad)
        assert out.exit_code == 2 and "max-runs" in out.output.replace("_", "-"), out.output
    per_run = _invoke("--run", str(uuid.uuid4()), "--token", "agr_lrn_x", "--max-runs", "2")
    assert per_run.exit_code == 2 and "for a pool learner" in per_run.output, per_run.output
    versions = _invoke("--registration-token", "agr_reg_x", "--max-versions", "2")
    assert versions.exit_code == 2 and "--max-versions" in versions.output, versions.output
    assert seen == []
    assert _invoke("--registration-token", "agr_reg_x", "--max-runs", "3").exit_code == 0
    assert [s.max_runs for s in seen] == [3]


def test_a_pool_learner_under_torchrun_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from learner.main import main

    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    settings = LearnerSettings(server_url=SERVER, registration_token="agr_reg_x")
    assert main(settings) == 2
    assert "data-parallel pool learners" in capsys.readouterr().err
