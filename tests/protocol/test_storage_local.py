"""LocalStore specifics: signed URLs (verify), the reserved temp folder, atomic commits."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from protocol.storage import InvalidKey, ObjectExists
from protocol.storage_local import TMP_DIR, LocalStore, URLRefused

SECRET = "s" * 40
SHA = hashlib.sha256(b"hello").hexdigest()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _split(url: str) -> tuple[str, dict[str, str]]:
    parts = urlsplit(url)
    key = parts.path.removeprefix("/blobs/")
    return key, {k: v[0] for k, v in parse_qs(parts.query).items()}


@pytest.fixture
def clock() -> Clock:
    return Clock(1_800_000_000.0)


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> LocalStore:
    return LocalStore(tmp_path / "b", "http://cp.example/blobs/", SECRET, clock=clock)


def test_put_url_carries_and_signs_its_conditions(store: LocalStore, clock: Clock) -> None:
    put = store.presign_put(
        "runs/r/batches/l-3.parquet", size=5, sha256_hex=SHA, ttl_s=60, if_none_match=True
    )
    assert put.url.startswith("http://cp.example/blobs/runs/r/batches/l-3.parquet?")
    assert put.headers == {"Content-Length": "5", "If-None-Match": "*"}
    key, q = _split(put.url)
    grant = store.verify("PUT", key, q)
    assert (grant.size, grant.sha256_hex, grant.if_none_match) == (5, SHA, True)
    assert grant.expires_at == int(clock.now) + 60


@pytest.mark.parametrize(
    "change",
    [
        {"len": "6"},
        {"sha256": hashlib.sha256(b"other").hexdigest()},
        {"nx": "0"},
        {"exp": str(1_800_000_000 + 3600)},
    ],
)
def test_any_changed_condition_breaks_the_signature(store: LocalStore, change: dict) -> None:
    key, q = _split(
        store.presign_put("a.bin", size=5, sha256_hex=SHA, ttl_s=60, if_none_match=True).url
    )
    with pytest.raises(URLRefused, match="signature"):
        store.verify("PUT", key, q | change)


def test_refuses_other_key_method_tampered_missing_and_expired(
    store: LocalStore, clock: Clock
) -> None:
    key, q = _split(store.presign_get("a/b.bin", 30))
    assert store.verify("GET", key, q).key == "a/b.bin"
    with pytest.raises(URLRefused):
        store.verify("GET", "a/c.bin", q)
    with pytest.raises(URLRefused):
        store.verify("PUT", key, q)
    tampered = q["sig"][:-1] + ("0" if q["sig"][-1] != "0" else "1")
    with pytest.raises(URLRefused):
        store.verify("GET", key, q | {"sig": tampered})
    with pytest.raises(URLRefused):
        store.verify("GET", key, {k: v for k, v in q.items() if k != "sig"})
    other = LocalStore(store.root, "http://cp.example/blobs", "t" * 40, clock=clock)
    with pytest.raises(URLRefused):
        other.verify("GET", key, q)
    clock.now += 30
    with pytest.raises(URLRefused, match="expired"):
        store.verify("GET", key, q)


def test_keys_with_odd_characters_round_trip_through_the_url(store: LocalStore) -> None:
    url = store.presign_get("runs/r 1/ä?x=1#y.bin", 60)
    assert "?x" not in url.split("?", 1)[0] and "#" not in url
    key, q = _split(url)
    assert store.verify("GET", unquote(key), q).key == "runs/r 1/ä?x=1#y.bin"


def test_temp_folder_is_reserved_and_hidden(store: LocalStore) -> None:
    with pytest.raises(InvalidKey):
        store.put_bytes(f"{TMP_DIR}/x", b"x")
    tmp = store.new_temp()
    store.put_bytes("a.bin", b"a")
    assert store.list("") == ["a.bin"]
    tmp.unlink()


def test_commit_leaves_no_temp_files_and_prunes_empty_folders(store: LocalStore) -> None:
    store.put_bytes("runs/r/adapters/v000001/a.bin", b"1")
    store.put_bytes("runs/r/adapters/v000001/a.bin", b"2")
    with pytest.raises(ObjectExists):
        store.put_bytes("runs/r/adapters/v000001/a.bin", b"3", if_none_match=True)
    assert list((store.root / TMP_DIR).iterdir()) == []
    store.delete("runs/r/adapters/v000001/a.bin")
    assert not (store.root / "runs").exists()
