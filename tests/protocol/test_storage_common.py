"""The same ObjectStore contract on both implementations: moto's S3 server and a local folder."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from protocol.storage import InvalidKey, ObjectExists, ObjectNotFound, ObjectStore
from protocol.storage_local import LocalStore

MB = 1024 * 1024


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "s3":
        s3: ObjectStore = request.getfixturevalue("s3_store")
        return s3
    return LocalStore(tmp_path / "bucket", "http://testserver/blobs", "k" * 40)


def test_bytes_round_trip_head_list_delete(store: ObjectStore) -> None:
    data = os.urandom(1000)
    info = store.put_bytes("runs/r1/adapters/v000001/adapter_model.safetensors", data)
    store.put_bytes("runs/r1/adapters/v000002/adapter_config.json", b"{}")
    store.put_bytes("runs/r10/batches/a-1.parquet", b"x")

    assert info.size == len(data)
    assert store.get_bytes("runs/r1/adapters/v000001/adapter_model.safetensors") == data
    head = store.head("runs/r1/adapters/v000001/adapter_model.safetensors")
    assert head is not None and head.size == len(data)
    assert store.head("runs/r1/nothing") is None
    assert store.list("runs/r1/") == [
        "runs/r1/adapters/v000001/adapter_model.safetensors",
        "runs/r1/adapters/v000002/adapter_config.json",
    ]
    assert len(store.list("runs/r1")) == 3  # a plain string prefix, as S3's
    assert store.list("runs/r2/") == []

    store.delete("runs/r1/adapters/v000001/adapter_model.safetensors")
    store.delete("runs/r1/adapters/v000001/adapter_model.safetensors")  # idempotent
    assert store.head("runs/r1/adapters/v000001/adapter_model.safetensors") is None
    assert store.list("runs/r1/") == ["runs/r1/adapters/v000002/adapter_config.json"]
    with pytest.raises(ObjectNotFound):
        store.get_bytes("runs/r1/adapters/v000001/adapter_model.safetensors")


def test_overwrite_allowed_unless_conditional(store: ObjectStore) -> None:
    store.put_bytes("a/b.bin", b"one")
    store.put_bytes("a/b.bin", b"two")
    assert store.get_bytes("a/b.bin") == b"two"
    with pytest.raises(ObjectExists):
        store.put_bytes("a/b.bin", b"three", if_none_match=True)
    assert store.get_bytes("a/b.bin") == b"two"
    store.put_bytes("a/c.bin", b"first", if_none_match=True)
    assert store.get_bytes("a/c.bin") == b"first"


def test_file_round_trip_and_conditional_file_put(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 * MB + 17))
    store.put_file("f/one.bin", src, if_none_match=True)
    dest = tmp_path / "dest.bin"
    store.download_file("f/one.bin", dest)
    assert dest.read_bytes() == src.read_bytes()
    with pytest.raises(ObjectExists):
        store.put_file("f/one.bin", src, if_none_match=True)
    with pytest.raises(ObjectNotFound):
        store.download_file("f/missing.bin", tmp_path / "missing.bin")
    assert not (tmp_path / "missing.bin").exists()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_30mb_multipart_upload_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(30 * MB))
    info = store.put_file("big/blob.bin", src, if_none_match=True)
    assert info.size == 30 * MB
    dest = tmp_path / "back.bin"
    store.download_file("big/blob.bin", dest)
    assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
    # The conditional multipart upload (If-None-Match on completion) refuses an overwrite too.
    with pytest.raises(ObjectExists):
        store.put_file("big/blob.bin", src, if_none_match=True)


def test_concurrent_conditional_puts_have_one_winner(store: ObjectStore) -> None:
    results: list[str] = []
    barrier = threading.Barrier(6)

    def put(i: int) -> None:
        barrier.wait()
        try:
            store.put_bytes("race/key.bin", f"writer {i}".encode(), if_none_match=True)
            results.append(f"won {i}")
        except ObjectExists:
            results.append("lost")

    threads = [threading.Thread(target=put, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r.startswith("won")]
    assert len(results) == 6 and len(winners) == 1
    assert store.get_bytes("race/key.bin") == f"writer {winners[0].split()[1]}".encode()


@pytest.mark.parametrize(
    "key", ["", "/abs", "a/../b", "..", "a//b", "a/./b", "a\\b", "a\x00b", "a\nb", "x" * 1025]
)
def test_bad_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidKey):
        store.put_bytes(key, b"x")
    with pytest.raises(InvalidKey):
        store.presign_get(key, 60)


def test_sha256_file_reads_in_chunks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The one file-hash helper (adapters, batches, the learner's uploads, benchmarks)."""
    import hashlib

    from protocol.storage import sha256_file

    data = bytes(range(256)) * 5000  # several chunks of 1 KiB
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path, chunk=1024) == hashlib.sha256(data).hexdigest()
