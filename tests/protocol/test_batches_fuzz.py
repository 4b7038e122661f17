"""Bounded-time fuzz of the batch reader: random bytes and mutated valid files raise nothing
but BatchRejected (a mutation that leaves the file valid may also be accepted)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.batches import BatchRejected, read_batch
from tests.protocol import batch_factory as bf

_DIR = Path(tempfile.mkdtemp(prefix="agr-fuzz-"))
_VALID = bf.write_valid(_DIR / "valid.parquet").read_bytes()
_FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)


def _read(raw: bytes) -> None:
    path = _DIR / "case.parquet"
    path.write_bytes(raw)
    try:
        data = read_batch(path, bf.make_expect())
    except BatchRejected as exc:
        assert exc.reason in ("invalid", "checksum", "prompt_mismatch")
        assert exc.check
    else:
        assert data.n_samples == len(bf.PROMPT_ROWS) * bf.GROUP


@pytest.mark.timeout(120)
@_FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes(raw: bytes) -> None:
    _read(raw)


@pytest.mark.timeout(120)
@_FUZZ
@given(st.binary(max_size=64))
def test_random_bytes_with_parquet_magic(raw: bytes) -> None:
    _read(b"PAR1" + raw + b"PAR1")


@pytest.mark.timeout(120)
@_FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8
    )
)
def test_mutated_valid_file(mutations: list[tuple[int, int]]) -> None:
    raw = bytearray(_VALID)
    for pos, value in mutations:
        raw[pos] = value
    _read(bytes(raw))


@pytest.mark.timeout(120)
@_FUZZ
@given(st.integers(0, len(_VALID)), st.integers(0, len(_VALID)), st.binary(max_size=32))
def test_spliced_valid_file(start: int, stop: int, insert: bytes) -> None:
    lo, hi = sorted((start, stop))
    _read(_VALID[:lo] + insert + _VALID[hi:])
