"""Rollout batch files: writer/reader round trip and a corpus of malformed files."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from protocol.batches import BatchLimits, BatchRejected, read_batch, write_batch
from tests.protocol import batch_factory as bf


def _reject(path: Path, expect=None) -> BatchRejected:
    with pytest.raises(BatchRejected) as info:
        read_batch(path, expect or bf.make_expect())
    return info.value


def test_round_trip(tmp_path: Path) -> None:
    samples = bf.make_samples(seed=1)
    path = tmp_path / "batch.parquet"
    info = write_batch(path, bf.make_meta(), samples)
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.bytes == path.stat().st_size
    assert info.n_samples == len(samples)
    assert info.n_groups == len(bf.PROMPT_ROWS)
    assert info.n_tokens == sum(len(s.completion_token_ids) for s in samples)

    data = read_batch(path, bf.make_expect(sha256=info.sha256))
    assert data.metadata == bf.make_meta()
    assert data.n_samples == len(samples)
    assert data.n_tokens == info.n_tokens
    by_key = {(s.prompt_row_id, s.group_index): s for s in samples}
    keys = list(zip(data.prompt_row_ids, data.group_indices, strict=True))
    assert keys == sorted(by_key)  # canonical order
    for i, key in enumerate(keys):
        s = by_key[key]
        assert data.prompt_token_ids[i] == list(s.prompt_token_ids)
        assert data.completion_token_ids[i] == list(s.completion_token_ids)
        np.testing.assert_array_equal(
            np.float32(data.behaviour_logprobs[i]), np.float32(s.behaviour_logprobs)
        )
        assert data.finish_reasons[i] == s.finish_reason


def test_written_file_is_plain_parquet(tmp_path: Path) -> None:
    """Any Parquet reader opens it (plain Parquet: docs/architecture/bucket.md, "Bucket layout and
    batch format")."""
    path = bf.write_valid(tmp_path / "b.parquet")
    table = pq.read_table(path)
    assert table.num_rows == len(bf.PROMPT_ROWS) * bf.GROUP
    assert table.column_names[0] == "prompt_row_id"


def test_tiny_positive_logprob_is_tolerated(tmp_path: Path) -> None:
    table = bf.valid_table()
    lps = table.column("behaviour_logprobs").to_pylist()
    lps[0][0] = 1e-7
    table = bf.with_column(table, "behaviour_logprobs", pa.array(lps, pa.list_(pa.float32())))
    read_batch(bf.write_table(tmp_path / "b.parquet", table), bf.make_expect())


# --- files that are not (whole) Parquet -------------------------------------------------------


def test_truncated(tmp_path: Path) -> None:
    path = bf.write_valid(tmp_path / "b.parquet")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "not_parquet")


@pytest.mark.parametrize("content", [b"", b"PAR1", b"hello, world " * 10, b"\x80\x04K\x01."])
def test_not_parquet(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "b.parquet"
    path.write_bytes(content)
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "not_parquet")


def test_missing_file(tmp_path: Path) -> None:
    err = _reject(tmp_path / "nope.parquet")
    assert (err.reason, err.check) == ("invalid", "missing")


def test_footer_length_out_of_bounds(tmp_path: Path) -> None:
    path = bf.write_valid(tmp_path / "b.parquet")
    raw = bytearray(path.read_bytes())
    raw[-8:-4] = struct.pack("<I", 2**31)
    path.write_bytes(bytes(raw))
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "footer")


def test_corrupt_footer(tmp_path: Path) -> None:
    path = bf.write_valid(tmp_path / "b.parquet")
    raw = bytearray(path.read_bytes())
    (footer_len,) = struct.unpack("<I", raw[-8:-4])
    start = len(raw) - 8 - footer_len
    raw[start : start + footer_len] = b"\xff" * footer_len
    path.write_bytes(bytes(raw))
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "not_parquet")


def test_file_too_large(tmp_path: Path) -> None:
    path = bf.write_valid(tmp_path / "b.parquet")
    expect = bf.make_expect(limits=BatchLimits(max_file_bytes=path.stat().st_size - 1))
    err = _reject(path, expect)
    assert (err.reason, err.check) == ("invalid", "too_large")


# --- checksum -----------------------------------------------------------------------------------


def test_wrong_sha256(tmp_path: Path) -> None:
    path = bf.write_valid(tmp_path / "b.parquet")
    err = _reject(path, bf.make_expect(sha256="0" * 64))
    assert (err.reason, err.check) == ("checksum", "sha256")


def test_tampered_file_fails_checksum(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    info = write_batch(path, bf.make_meta(), bf.make_samples())
    bf.write_valid(path, seed=5)  # another valid file under the same key
    err = _reject(path, bf.make_expect(sha256=info.sha256))
    assert (err.reason, err.check) == ("checksum", "sha256")


# --- schema -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "array_of"),
    [
        (
            "completion_token_ids",
            lambda t: pa.array(t.column("completion_token_ids").to_pylist(), pa.list_(pa.int64())),
        ),
        (
            "prompt_row_id",
            lambda t: pa.array([str(v) for v in t.column("prompt_row_id").to_pylist()]),
        ),
        (
            "behaviour_logprobs",
            lambda t: pa.array(t.column("behaviour_logprobs").to_pylist(), pa.list_(pa.float64())),
        ),
        ("group_index", lambda t: pa.array(t.column("group_index").to_pylist(), pa.float64())),
        ("finish_reason", lambda t: pa.array([1] * t.num_rows, pa.int32())),
    ],
)
def test_wrong_column_type(tmp_path: Path, name: str, array_of) -> None:
    table = bf.valid_table()
    table = bf.with_column(table, name, array_of(table))
    err = _reject(bf.write_table(tmp_path / "b.parquet", table))
    assert (err.reason, err.check) == ("invalid", "schema")
    assert name in err.detail


def test_missing_and_extra_columns(tmp_path: Path) -> None:
    table = bf.valid_table()
    err = _reject(bf.write_table(tmp_path / "a.parquet", table.drop_columns(["finish_reason"])))
    assert err.check == "schema"
    extra = table.append_column("payload", pa.array([b"x"] * table.num_rows))
    err = _reject(bf.write_table(tmp_path / "b.parquet", extra))
    assert err.check == "schema"


# --- metadata -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run_id", "6f1c2a3e-0000-4000-8000-00000000ffff"),
        ("lease_id", "6f1c2a3e-0000-4000-8000-00000000ffff"),
        ("fencing", 6),
        ("worker_id", "6f1c2a3e-0000-4000-8000-00000000ffff"),
        ("adapter_version", 2),
        ("adapter_sha256", "ee" * 32),
        ("tokenizer_fingerprint", "ff" * 32),
        ("sampling", {**bf.SAMPLING, "temperature": 1.0}),
    ],
)
def test_metadata_mismatch(tmp_path: Path, field: str, value: object) -> None:
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(**{field: value}), bf.make_samples())
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", f"metadata_{field}")


def test_adapter_version_zero_has_no_sha(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(adapter_version=0, adapter_sha256=None), bf.make_samples())
    read_batch(path, bf.make_expect(adapter_version=0, adapter_sha256=None))
    err = _reject(path)
    assert err.check == "metadata_adapter_version"


@pytest.mark.parametrize("raw", [None, b"{not json", b'{"run_id": 5}', b"[]", b'{"fencing": "7"}'])
def test_malformed_metadata(tmp_path: Path, raw: bytes | None) -> None:
    table = bf.valid_table()
    meta = {} if raw is None else {b"asyncgrpo.batch": raw}
    path = tmp_path / "b.parquet"
    pq.write_table(table.replace_schema_metadata(meta), path)
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "metadata")


def test_metadata_with_extra_field(tmp_path: Path) -> None:
    import json

    raw = bf.make_meta().model_dump(mode="json") | {"exec": "rm -rf /"}
    path = tmp_path / "b.parquet"
    pq.write_table(
        bf.valid_table().replace_schema_metadata({b"asyncgrpo.batch": json.dumps(raw)}), path
    )
    assert _reject(path).check == "metadata"


# --- counts and groups --------------------------------------------------------------------------


def test_zero_rows(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), [])
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "empty")


def test_wrong_sample_count(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), bf.make_samples()[:-1])
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "sample_count")


def test_more_samples_than_leased(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    samples = bf.make_samples()
    write_batch(path, bf.make_meta(), samples + samples[:1])
    assert _reject(path).check == "sample_count"


def test_prompt_row_not_in_lease(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    samples = [
        replace(s, prompt_row_id=999) if s.prompt_row_id == 101 else s for s in bf.make_samples()
    ]
    write_batch(path, bf.make_meta(), samples)
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "prompt_rows")


def test_uneven_groups(tmp_path: Path) -> None:
    samples = bf.make_samples()
    victim = next(i for i, s in enumerate(samples) if s.prompt_row_id == 101)
    samples[victim] = replace(samples[victim], prompt_row_id=102, group_index=bf.GROUP)
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), samples)
    assert _reject(path).check == "group_size"


def test_duplicate_group_index(tmp_path: Path) -> None:
    samples = bf.make_samples()
    i = next(i for i, s in enumerate(samples) if (s.prompt_row_id, s.group_index) == (101, 3))
    samples[i] = replace(samples[i], group_index=0)
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), samples)
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "group_indices")


# --- values -------------------------------------------------------------------------------------


def _with_logprob(tmp_path: Path, value: float) -> Path:
    samples = bf.make_samples()
    s = samples[3]
    lps = list(s.behaviour_logprobs)
    lps[-1] = value
    samples[3] = replace(s, behaviour_logprobs=lps)
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), samples)
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logprob(tmp_path: Path, value: float) -> None:
    err = _reject(_with_logprob(tmp_path, value))
    assert (err.reason, err.check) == ("invalid", "logprob_not_finite")


@pytest.mark.parametrize("value", [0.5, 1e-3])
def test_positive_logprob(tmp_path: Path, value: float) -> None:
    err = _reject(_with_logprob(tmp_path, value))
    assert (err.reason, err.check) == ("invalid", "logprob_positive")


@pytest.mark.parametrize(
    ("column", "bad"),
    [
        ("completion_token_ids", bf.VOCAB),
        ("completion_token_ids", -1),
        ("prompt_token_ids", bf.VOCAB + 7),
    ],
)
def test_token_out_of_vocabulary(tmp_path: Path, column: str, bad: int) -> None:
    samples = bf.make_samples()
    s = samples[0]
    ids = list(getattr(s, column))
    ids[0] = bad
    samples = [
        replace(x, **{column: ids})
        if x.prompt_row_id == s.prompt_row_id and (column == "prompt_token_ids" or x is s)
        else x
        for x in samples
    ]
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), samples)
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "token_out_of_vocab")


def test_completion_over_max_new_tokens(tmp_path: Path) -> None:
    samples = bf.make_samples()
    n = bf.MAX_NEW + 1
    samples[0] = replace(samples[0], completion_token_ids=[3] * n, behaviour_logprobs=[-1.0] * n)
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), samples)
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "completion_too_long")


def test_empty_completion(tmp_path: Path) -> None:
    samples = bf.make_samples()
    samples[0] = replace(samples[0], completion_token_ids=[], behaviour_logprobs=[])
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), samples)
    assert _reject(path).check == "empty_completion"


def test_logprob_count_differs_from_completion(tmp_path: Path) -> None:
    samples = bf.make_samples()
    s = samples[0]
    samples[0] = replace(s, behaviour_logprobs=[*s.behaviour_logprobs, -0.5])
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), samples)
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "logprob_length")


def test_unknown_finish_reason(tmp_path: Path) -> None:
    samples = bf.make_samples()
    samples[0] = replace(samples[0], finish_reason="banana")
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), samples)
    assert _reject(path).check == "finish_reason"


def test_nulls(tmp_path: Path) -> None:
    table = bf.valid_table()
    reasons = table.column("finish_reason").to_pylist()
    reasons[2] = None
    table = bf.with_column(table, "finish_reason", pa.array(reasons, pa.string()))
    assert _reject(bf.write_table(tmp_path / "a.parquet", table)).check == "nulls"
    table = bf.valid_table()
    ids = table.column("completion_token_ids").to_pylist()
    ids[1][0] = None
    table = bf.with_column(table, "completion_token_ids", pa.array(ids, pa.list_(pa.int32())))
    assert _reject(bf.write_table(tmp_path / "b.parquet", table)).check == "nulls"


# --- prompts ------------------------------------------------------------------------------------


def test_prompt_differs_from_learner_tokenization(tmp_path: Path) -> None:
    path = bf.write_valid(tmp_path / "b.parquet")
    want = {r: bf.prompt_of(r) for r in bf.PROMPT_ROWS}
    want[102] = [*want[102][:-1], 9, 2]
    err = _reject(path, bf.make_expect(prompt_token_ids=want))
    assert (err.reason, err.check) == ("prompt_mismatch", "prompt_tokens")


def test_completions_of_one_prompt_disagree(tmp_path: Path) -> None:
    samples = bf.make_samples()
    i = next(i for i, s in enumerate(samples) if (s.prompt_row_id, s.group_index) == (103, 2))
    samples[i] = replace(samples[i], prompt_token_ids=[1, 7, 7, 2])
    path = tmp_path / "b.parquet"
    write_batch(path, bf.make_meta(), samples)
    err = _reject(path, bf.make_expect(prompt_token_ids=None))
    assert (err.reason, err.check) == ("prompt_mismatch", "group_prompt")


# --- hostile sizes ------------------------------------------------------------------------------


def test_ten_million_element_list_is_refused_from_the_footer(tmp_path: Path) -> None:
    """One completion of 10M tokens: a small file (zstd) that must be refused before decoding."""
    table = bf.valid_table()
    big = 10_000_000
    lengths = [len(x) for x in table.column("completion_token_ids").to_pylist()]
    lengths[0] = big
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(np.zeros(int(offsets[-1]), dtype=np.int32))
    column = pa.ListArray.from_arrays(pa.array(offsets), values)
    table = bf.with_column(table, "completion_token_ids", column)
    path = tmp_path / "big.parquet"
    pq.write_table(
        table.replace_schema_metadata(
            {b"asyncgrpo.batch": bf.make_meta().model_dump_json().encode()}
        ),
        path,
        compression="zstd",
    )
    del table, column, values
    assert path.stat().st_size < 2_000_000  # small on disk, 40 MB decoded

    pool = pa.default_memory_pool()
    before = pool.bytes_allocated()
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "list_too_long")
    assert pool.bytes_allocated() - before < 1_000_000


def test_column_metadata_pyarrow_cannot_read_is_rejected_not_the_end_of_the_learner(
    tmp_path: Path,
) -> None:
    """Size statistics that do not fit the column's levels (behaviour_logprobs declared
    required in the schema): pyarrow's C++ refuses the column chunk's metadata with an
    exception its binding does not translate, ending the process that reads the footer's
    column metadata, unless the footer's bytes are checked first."""
    from tests.server.datasets.files import required_in_schema

    path = bf.write_valid(tmp_path / "b.parquet")
    path.write_bytes(required_in_schema(path.read_bytes(), "behaviour_logprobs"))
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "footer"), err
    assert "behaviour_logprobs" in str(err)
