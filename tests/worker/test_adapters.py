"""Adapter cache: download by presigned URL from a real S3 protocol server (moto), verify
sha256 per file and per version, reuse by (run, version), LRU eviction by size."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from protocol.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterManifest, AdapterMismatch
from protocol.adapters import AdapterFile as ManifestFile
from protocol.schemas import AdapterFile, AdapterRef
from protocol.transfer import ChecksumMismatch
from worker.adapters import AdapterCache

RUN = "0f2b7c4e-1111-4e0e-9a55-5b7d2f8c0001"


def publish(store: Any, run: str, version: int, payload: bytes) -> AdapterRef:
    """Put an adapter version's two files in the bucket; return the lease's reference to it."""
    files = {ADAPTER_WEIGHTS: payload, ADAPTER_CONFIG: json.dumps({"r": version}).encode()}
    entries, refs = [], []
    for name, data in sorted(files.items()):
        key = f"runs/{run}/adapters/v{version:06d}/{name}"
        store.put_bytes(key, data)
        digest = hashlib.sha256(data).hexdigest()
        entries.append(ManifestFile(name, digest, len(data)))
        refs.append(AdapterFile(name=name, url=store.presign_get(key, 300), sha256=digest))
    return AdapterRef(
        version=version, sha256=AdapterManifest(tuple(entries)).version_sha256(), files=refs
    )


def test_download_verify_and_reuse(s3_store: Any, tmp_path: Path) -> None:
    ref = publish(s3_store, RUN, 1, b"w" * 1000)
    cache = AdapterCache(tmp_path, max_bytes=10_000)
    assert cache.ensure(RUN, 0, None) is None  # version 0 is the base model
    handle = cache.ensure(RUN, 1, ref)
    assert handle is not None
    assert (handle.path / ADAPTER_WEIGHTS).read_bytes() == b"w" * 1000
    again = cache.ensure(RUN, 1, ref)
    assert again is not None and again.path == handle.path
    assert cache.downloads == 1
    # A new process adopts what is on disk.
    assert AdapterCache(tmp_path, max_bytes=10_000).ensure(RUN, 1, ref) is not None


def test_lru_eviction_by_bytes(s3_store: Any, tmp_path: Path) -> None:
    refs = {v: publish(s3_store, RUN, v, bytes([v]) * 4000) for v in (1, 2, 3)}
    cache = AdapterCache(tmp_path, max_bytes=9_000)
    cache.ensure(RUN, 1, refs[1])
    cache.ensure(RUN, 2, refs[2])
    cache.ensure(RUN, 1, refs[1])  # 1 is now the most recently used
    cache.ensure(RUN, 3, refs[3])  # over the bound: 2 goes
    assert cache.keys() == [(RUN, 1), (RUN, 3)]
    assert not (tmp_path / RUN / "v000002").exists()
    assert cache.total_bytes <= 9_000


def test_tampered_file_is_refused_and_nothing_is_cached(s3_store: Any, tmp_path: Path) -> None:
    ref = publish(s3_store, RUN, 1, b"good")
    s3_store.put_bytes(f"runs/{RUN}/adapters/v000001/{ADAPTER_WEIGHTS}", b"evil")
    cache = AdapterCache(tmp_path, max_bytes=10_000)
    with pytest.raises(ChecksumMismatch):
        cache.ensure(RUN, 1, ref)
    assert cache.keys() == []
    assert not (tmp_path / RUN / "v000001").exists()


def test_version_digest_must_match(s3_store: Any, tmp_path: Path) -> None:
    ref = publish(s3_store, RUN, 1, b"good")
    wrong = ref.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(AdapterMismatch, match="manifest"):
        AdapterCache(tmp_path, max_bytes=10_000).ensure(RUN, 1, wrong)


def test_damaged_cache_entry_is_fetched_again(s3_store: Any, tmp_path: Path) -> None:
    ref = publish(s3_store, RUN, 1, b"good" * 10)
    cache = AdapterCache(tmp_path, max_bytes=10_000)
    handle = cache.ensure(RUN, 1, ref)
    assert handle is not None
    (handle.path / ADAPTER_WEIGHTS).write_bytes(b"bitrot")
    handle2 = cache.ensure(RUN, 1, ref)
    assert handle2 is not None
    assert (handle2.path / ADAPTER_WEIGHTS).read_bytes() == b"good" * 10
    assert cache.downloads == 2


def test_versions_of_held_leases_are_never_evicted(s3_store: Any, tmp_path: Path) -> None:
    """A held lease's version stays on disk while newer ones arrive (a multi-turn rollout may
    reload it between turns), even above the byte bound; once released, it goes first."""
    refs = {v: publish(s3_store, RUN, v, bytes([v]) * 4000) for v in (1, 2, 3)}
    held = {(RUN, 1)}
    cache = AdapterCache(tmp_path, max_bytes=5_000, in_use=lambda: set(held))
    cache.ensure(RUN, 1, refs[1])
    cache.ensure(RUN, 2, refs[2])  # over the bound, but v1 is held
    assert cache.keys() == [(RUN, 1), (RUN, 2)] and (tmp_path / RUN / "v000001").is_dir()
    held.clear()
    cache.ensure(RUN, 3, refs[3])
    assert cache.keys() == [(RUN, 3)] and not (tmp_path / RUN / "v000001").exists()
