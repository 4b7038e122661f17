"""The parsed-config cache (server/runs/service.py config_of): sized to the live runs, so a
lease call on any of 100 live runs does not re-read and re-validate its config; the dashboard's
runs table reading 200 runs' configs, 100 of them finished, keeps them apart and evicts none of
the live ones; a missing run or an invalid config leaves no per-run loading lock behind."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import update
from sqlalchemy.orm import Session

from protocol.run_config import RunConfig
from server.dashboard import service as dashboard
from server.errors import NotFound
from server.models import Run
from server.runs import service
from tests.conftest import mint_token
from tests.server.dashboard.test_pages import login
from tests.server.runs.conftest import example_config

LIVE_RUNS = 100


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every RunConfig validation the runs service makes, counted."""
    calls: list[Any] = []
    original = RunConfig.model_validate

    def counting(obj: Any, *args: Any, **kwargs: Any) -> RunConfig:
        calls.append(obj)
        return original(obj, *args, **kwargs)

    monkeypatch.setattr(service, "RunConfig", type("Counted", (), {"model_validate": counting}))
    service.forget_configs()  # as a fresh process
    return calls


def _live_runs(db: Session, n: int) -> list[uuid.UUID]:
    tiny = {"kind": "generator", "generator": "arithmetic", "size": 2, "seed": 0}
    config = RunConfig.model_validate(example_config(dataset=tiny))
    ids = [service.create_run(db, config)[0].id for _ in range(n)]
    db.commit()
    return ids


def test_no_revalidation_per_call_with_100_live_runs(runs_app, db: Session, validations) -> None:  # type: ignore[no-untyped-def]
    run_ids = _live_runs(db, LIVE_RUNS)
    service.forget_configs()  # parse from the database, not from creation's copies
    for _ in range(3):  # lease calls cycling over every live run
        for run_id in run_ids:
            assert service.config_of(db, run_id).name == "arithmetic-smollm2"
    assert len(validations) == LIVE_RUNS  # each parsed once, none again


def test_the_runs_table_over_finished_runs_evicts_no_live_config(  # type: ignore[no-untyped-def]
    runs_app, runs_client, db: Session
) -> None:
    run_ids = _live_runs(db, 2 * LIVE_RUNS)
    live, finished = run_ids[:LIVE_RUNS], run_ids[LIVE_RUNS:]
    db.execute(update(Run).where(Run.id.in_(finished)).values(status="completed"))
    db.commit()
    login(runs_client, mint_token(runs_app, "admin", name="dash"))  # shows the runs page
    service.forget_configs()  # a fresh process

    def lease_path() -> int:
        """Validations made by the lease path's config reads of every live run."""
        before = service.config_validations()
        for run_id in live:
            assert service.config_of(db, run_id).name == "arithmetic-smollm2"
        db.rollback()  # SQLite: the open transaction would hold the write lock
        return service.config_validations() - before

    assert lease_path() == LIVE_RUNS  # cold: each parsed once
    for _ in range(2):  # the runs table, as the page polls it: 200 runs, finished ones included
        before = service.config_validations()
        table = runs_client.get("/runs/table")
        assert table.status_code == 200 and table.text.count("/runs/") >= 2 * LIVE_RUNS
        assert service.config_validations() - before == (LIVE_RUNS if _ == 0 else 0)
        assert lease_path() == 0  # no live config was evicted
    assert len(dashboard.run_rows(db, None)) == 2 * LIVE_RUNS


def test_missing_run_leaves_no_loading_lock(runs_app, db: Session) -> None:  # type: ignore[no-untyped-def]
    missing = uuid.uuid4()
    with pytest.raises(NotFound):
        service.config_of(db, missing)
    assert missing not in service._LOADING


def test_invalid_config_leaves_no_loading_lock(runs_app, db: Session) -> None:  # type: ignore[no-untyped-def]
    [run_id] = _live_runs(db, 1)
    db.execute(update(Run).where(Run.id == run_id).values(config={"name": "broken"}))
    db.commit()
    service.forget_configs()
    with pytest.raises(ValidationError):
        service.config_of(db, run_id)
    assert run_id not in service._LOADING
