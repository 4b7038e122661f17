"""The parsed-config cache (server/runs/service.py config_of): sized to the live runs, so a
lease call on any of 100 live runs does not re-read and re-validate its config; a missing run or
an invalid config leaves no per-run loading lock behind."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import update
from sqlalchemy.orm import Session

from protocol.run_config import RunConfig
from server.errors import NotFound
from server.models import Run
from server.runs import service
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
    monkeypatch.setattr(service, "_capacity", 64, raising=False)  # as a fresh process
    return calls


def _live_runs(db: Session, n: int) -> list[uuid.UUID]:
    tiny = {"kind": "generator", "generator": "arithmetic", "size": 2, "seed": 0}
    config = RunConfig.model_validate(example_config(dataset=tiny))
    ids = [service.create_run(db, config)[0].id for _ in range(n)]
    db.commit()
    return ids


def test_no_revalidation_per_call_with_100_live_runs(runs_app, db: Session, validations) -> None:  # type: ignore[no-untyped-def]
    run_ids = _live_runs(db, LIVE_RUNS)
    service._CACHE.clear()  # parse from the database, not from creation's copies
    for _ in range(3):  # lease calls cycling over every live run
        for run_id in run_ids:
            assert service.config_of(db, run_id).name == "arithmetic-smollm2"
    assert len(validations) == LIVE_RUNS  # each parsed once, none again


def test_missing_run_leaves_no_loading_lock(runs_app, db: Session) -> None:  # type: ignore[no-untyped-def]
    missing = uuid.uuid4()
    with pytest.raises(NotFound):
        service.config_of(db, missing)
    assert missing not in service._LOADING


def test_invalid_config_leaves_no_loading_lock(runs_app, db: Session) -> None:  # type: ignore[no-untyped-def]
    [run_id] = _live_runs(db, 1)
    db.execute(update(Run).where(Run.id == run_id).values(config={"name": "broken"}))
    db.commit()
    service._CACHE.clear()
    with pytest.raises(ValidationError):
        service.config_of(db, run_id)
    assert run_id not in service._LOADING
