"""ObjectStore.sha256 (what complete checks the manifest against) on both stores, and the local
store's sweep of temp files left by PUTs a crash cut off."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from protocol.storage import ObjectStore
from protocol.storage_local import STALE_TEMP_S, LocalStore


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "s3":
        s3: ObjectStore = request.getfixturevalue("s3_store")
        return s3
    return LocalStore(tmp_path / "bucket", "http://testserver/blobs", "k" * 40)


def test_sha256_of_a_stored_object(store: ObjectStore) -> None:
    data = os.urandom(5000)
    store.put_bytes("runs/r1/batches/b.parquet", data)
    stored = store.sha256("runs/r1/batches/b.parquet")
    if isinstance(store, LocalStore):
        assert stored == hashlib.sha256(data).hexdigest()
    else:
        # S3 returns the ChecksumSHA256 its PUT enforced; moto's server keeps none (None).
        assert stored in (hashlib.sha256(data).hexdigest(), None)
    assert store.sha256("runs/r1/batches/missing.parquet") is None


def test_stale_temp_files_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "bucket", "http://testserver/blobs", "k" * 40)
    crashed = store.new_temp()
    crashed.write_bytes(b"half a batch")
    old = time.time() - STALE_TEMP_S - 60
    os.utime(crashed, (old, old))
    live = store.new_temp()
    live.write_bytes(b"being written")
    assert store.sweep_stale_temps(STALE_TEMP_S) == 1
    assert not crashed.exists() and live.exists()


def test_a_new_server_sweeps_what_a_crashed_one_left(tmp_path: Path) -> None:
    from server.storage_factory import make_store
    from tests.conftest import make_settings

    first = LocalStore(tmp_path / "bucket", "http://testserver/blobs", "k" * 40)
    crashed = first.new_temp()
    old = time.time() - STALE_TEMP_S - 60
    os.utime(crashed, (old, old))
    make_store(make_settings("sqlite:///unused.db", tmp_path / "bucket"))
    assert not crashed.exists()
