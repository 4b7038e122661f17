"""Two run creations naming the same new hf spec at once: both insert its dataset row (unique
spec_key); the second waits on the first, then takes its row instead of failing with a 500."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import func, select

from protocol.run_config import HfDataset
from server.datasets import service
from server.models import Dataset

SPEC = HfDataset(kind="hf", path="json", data_files="/nowhere/train.jsonl")


@pytest.mark.timeout(60)
def test_concurrent_creations_of_one_hf_spec_share_its_row(ds_app) -> None:  # type: ignore[no-untyped-def]
    factory = ds_app.state.sessionmaker
    first = factory()
    mine = service.find_or_create_hf(first, SPEC)  # inserted, not committed: holds the key
    got: dict[str, Any] = {}

    def second() -> None:
        with factory() as session:
            try:
                got["id"] = service.find_or_create_hf(session, SPEC).id
                session.commit()
            except Exception as exc:  # reported below, not swallowed
                got["error"] = exc

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(1.0)  # the second creation is now waiting on the first's insert (or lock)
    first.commit()
    first.close()
    thread.join(30)
    assert not thread.is_alive()
    assert "error" not in got, got.get("error")
    assert got["id"] == mine.id
    with factory() as session:
        assert session.execute(select(func.count()).select_from(Dataset)).scalar_one() == 1
