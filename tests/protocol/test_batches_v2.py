"""Batch format 2 (one trajectory per row): round trip, format 1 files read as trajectories,
and every rejection of the validating reader (docs/architecture/environments.md)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from protocol.batches import (
    BatchRejected,
    TrajectorySample,
    read_batch,
    read_trajectories,
    trajectories_table,
    write_batch,
    write_trajectory_batch,
)
from protocol.environments import EnvironmentConfig
from tests.protocol import batch_factory as bf
from tests.protocol import trajectory_factory as tf


def _write(path: Path, samples: list[TrajectorySample] | None = None, **meta: Any) -> Path:
    write_trajectory_batch(path, tf.make_meta(**meta), samples or tf.make_samples())
    return path


def _reject(path: Path, expect: Any = None) -> BatchRejected:
    with pytest.raises(BatchRejected) as info:
        read_trajectories(path, expect or tf.make_expect())
    return info.value


def _doctored(path: Path, column: str, edit: Any) -> Path:
    """Rewrite one column of a valid file through `edit(list of row values)`."""
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    edit(values)
    i = table.column_names.index(column)
    field = table.schema.field(i)
    table = table.set_column(i, field, pa.array(values, field.type))
    pq.write_table(table, path)  # the schema's metadata (the footer) is kept
    return path


def test_round_trip(tmp_path: Path) -> None:
    samples = tf.make_samples(seed=1)
    path = tmp_path / "b.parquet"
    info = write_trajectory_batch(path, tf.make_meta(), samples)
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.n_samples == len(samples) and info.n_groups == len(bf.PROMPT_ROWS)
    assert info.n_tokens == sum(s.trajectory.trained_tokens for s in samples)

    batch = read_trajectories(path, tf.make_expect(sha256=info.sha256))
    assert batch.format_version == 2
    assert batch.metadata.environment == tf.env_json()
    assert batch.n_tokens == info.n_tokens
    keys = [(r.prompt_row_id, r.group_index) for r in batch.rows]
    by_key = {(s.prompt_row_id, s.group_index): s.trajectory for s in samples}
    assert keys == sorted(by_key)
    for r in batch.rows:
        t = by_key[(r.prompt_row_id, r.group_index)]
        assert (r.token_ids, r.loss_mask, r.spans) == (t.token_ids, t.loss_mask, t.spans)
        assert r.messages == t.messages and r.info == t.info
        assert (r.stop_reason, r.tool_calls, r.tool_errors) == ("done", t.tool_calls, 0)
        for got, want in zip(r.logprobs, t.logprobs, strict=True):
            assert (got is None) == (want is None)
            if want is not None:
                assert got == pytest.approx(want, rel=1e-6)
        assert r.prompt_token_ids == bf.prompt_of(r.prompt_row_id)
        assert r.model_token_ids == [x for x, m in zip(t.token_ids, t.loss_mask, strict=True) if m]


def test_read_batch_refuses_format_2(tmp_path: Path) -> None:
    err = None
    with pytest.raises(BatchRejected) as info:
        read_batch(_write(tmp_path / "b.parquet"), tf.make_expect())
    err = info.value
    assert (err.reason, err.check) == ("invalid", "format_version")


def test_format_1_reads_as_trajectories(tmp_path: Path) -> None:
    samples = bf.make_samples(seed=2)
    path = tmp_path / "v1.parquet"
    write_batch(path, bf.make_meta(), samples)
    assert "environment" not in json.loads(pq.read_schema(path).metadata[b"asyncgrpo.batch"])
    single = EnvironmentConfig()
    batch = read_trajectories(path, bf.make_expect(environment=single))
    assert batch.format_version == 1
    by_key = {(s.prompt_row_id, s.group_index): s for s in samples}
    for r in batch.rows:
        s = by_key[(r.prompt_row_id, r.group_index)]
        p, c = len(s.prompt_token_ids), len(s.completion_token_ids)
        assert r.token_ids == list(s.prompt_token_ids) + list(s.completion_token_ids)
        assert r.loss_mask == [0] * p + [1] * c
        assert r.logprobs[:p] == [None] * p
        assert s.behaviour_logprobs is not None
        assert r.logprobs[p:] == pytest.approx(list(s.behaviour_logprobs), rel=1e-6)
        assert [(x.kind, x.start, x.end) for x in r.spans] == [
            ("prompt", 0, p),
            ("model", p, p + c),
        ]
        assert r.messages is None
        assert r.stop_reason == {"stop": "done", "length": "length"}[s.finish_reason]
        assert r.model_token_ids == list(s.completion_token_ids)
    assert batch.n_tokens == sum(len(s.completion_token_ids) for s in samples)


def test_format_1_eval_reads_with_null_logprobs(tmp_path: Path) -> None:
    path = tmp_path / "v1e.parquet"
    samples = [replace(s, behaviour_logprobs=None) for s in bf.make_samples()]
    write_batch(path, bf.make_meta(kind="eval"), samples)
    batch = read_trajectories(path, bf.make_expect(kind="eval"))
    assert all(lp is None for r in batch.rows for lp in r.logprobs)
    assert all(r.trained_tokens >= 1 for r in batch.rows)


def test_format_1_is_refused_for_a_multi_turn_run(tmp_path: Path) -> None:
    path = bf.write_valid(tmp_path / "v1.parquet")
    err = _reject(path, bf.make_expect(environment=tf.ENV))
    assert (err.reason, err.check) == ("invalid", "format_version")


def test_eval_round_trip_has_a_null_logprob_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "e.parquet", kind="eval")
    assert pq.read_table(path).column("behaviour_logprobs").null_count == bf.GROUP * 3
    batch = read_trajectories(path, tf.make_expect(kind="eval"))
    assert all(lp is None for r in batch.rows for lp in r.logprobs)
    assert sum(r.trained_tokens for r in batch.rows) == batch.n_tokens > 0
    # a training read of it, and an eval read of a training batch, are refused
    assert _reject(path).check == "metadata_kind"
    train = _write(tmp_path / "t.parquet")
    assert _reject(train, tf.make_expect(kind="eval")).check == "metadata_kind"


def test_eval_batch_carrying_logprobs_is_refused(tmp_path: Path) -> None:
    table = trajectories_table(tf.make_meta(), tf.make_samples())
    meta = tf.make_meta(kind="eval")
    path = bf.write_table(tmp_path / "e.parquet", table, meta)
    assert _reject(path, tf.make_expect(kind="eval")).reason == "invalid"


def test_mask_that_does_not_match_its_tokens_is_rejected(tmp_path: Path) -> None:
    def flip(masks: list[list[int]]) -> None:
        masks[0][0] = 1  # a prompt token marked as trained

    path = _doctored(_write(tmp_path / "b.parquet"), "loss_mask", flip)
    err = _reject(path)
    assert (err.reason, err.check) == ("invalid", "trajectory")
    assert "loss_mask[0] is 1 in a prompt span" in err.detail


def test_mask_of_another_length_is_rejected(tmp_path: Path) -> None:
    path = _doctored(_write(tmp_path / "b.parquet"), "loss_mask", lambda m: m[1].append(1))
    err = _reject(path)
    assert err.check == "trajectory" and "one entry per token" in err.detail


def test_misaligned_logprobs_are_rejected(tmp_path: Path) -> None:
    def shift(lps: list[list[float | None]]) -> None:
        lps[2] = lps[2][1:] + [None]  # every log-prob one token early

    err = _reject(_doctored(_write(tmp_path / "b.parquet"), "behaviour_logprobs", shift))
    assert (err.reason, err.check) == ("invalid", "trajectory")
    assert "logprobs[" in err.detail


def test_logprob_on_an_environment_token_is_rejected(tmp_path: Path) -> None:
    def fill(lps: list[list[float | None]]) -> None:
        lps[0][0] = -1.0  # the first prompt token

    err = _reject(_doctored(_write(tmp_path / "b.parquet"), "behaviour_logprobs", fill))
    assert "must be None outside model spans" in err.detail


def test_positive_logprob_is_rejected_and_rounding_tolerated(tmp_path: Path) -> None:
    def at(value: float) -> Any:
        def edit(lps: list[list[float | None]]) -> None:
            lps[0][lps[0].index(next(x for x in lps[0] if x is not None))] = value

        return edit

    err = _reject(_doctored(_write(tmp_path / "a.parquet"), "behaviour_logprobs", at(0.5)))
    assert err.check == "logprob_positive"
    ok = _doctored(_write(tmp_path / "b.parquet"), "behaviour_logprobs", at(1e-7))
    assert read_trajectories(ok, tf.make_expect()).n_samples == bf.GROUP * 3


def test_spans_not_contiguous_are_rejected(tmp_path: Path) -> None:
    def gap(spans: list[list[dict[str, Any]]]) -> None:
        row = next(s for s in spans if len(s) >= 3)
        row[1]["start"] += 1

    err = _reject(_doctored(_write(tmp_path / "b.parquet"), "spans", gap))
    assert err.check == "trajectory" and "must be non-empty and start where" in err.detail


def test_two_model_spans_in_a_row_are_rejected(tmp_path: Path) -> None:
    def same(spans: list[list[dict[str, Any]]]) -> None:
        row = next(s for s in spans if len(s) >= 3)
        row[2]["kind"] = "model"
        row[1]["kind"] = "model"

    err = _reject(_doctored(_write(tmp_path / "b.parquet"), "spans", same))
    assert err.check == "trajectory"


def test_unknown_span_kind_and_stop_reason_are_rejected(tmp_path: Path) -> None:
    def kind(spans: list[list[dict[str, Any]]]) -> None:
        spans[0][0]["kind"] = "system"

    assert _reject(_doctored(_write(tmp_path / "a.parquet"), "spans", kind)).check == "trajectory"

    def reason(values: list[str]) -> None:
        values[0] = "crashed"

    err = _reject(_doctored(_write(tmp_path / "b.parquet"), "stop_reason", reason))
    assert err.check == "trajectory" and "stop_reason" in err.detail


def test_too_long_for_max_total_tokens_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path / "b.parquet")
    longest = max(len(r.token_ids) for r in read_trajectories(path, tf.make_expect()).rows)
    tight = EnvironmentConfig(
        name="tool_calls", tools=["calculator"], max_turns=3, max_total_tokens=longest - 1
    )
    path = _write(tmp_path / "c.parquet", environment=tf.env_json(tight))
    err = _reject(path, tf.make_expect(environment=tight))
    assert err.check == "trajectory" and "exceed max_total_tokens" in err.detail


def test_turn_longer_than_max_new_tokens_and_too_many_turns(tmp_path: Path) -> None:
    path = _write(tmp_path / "b.parquet")
    err = _reject(path, tf.make_expect(max_new_tokens=2))
    assert err.check in ("turn_too_long", "list_too_long")
    two = EnvironmentConfig(
        name="tool_calls", tools=["calculator"], max_turns=2, max_total_tokens=64
    )
    path = _write(tmp_path / "c.parquet", environment=tf.env_json(two))
    assert _reject(path, tf.make_expect(environment=two)).check == "max_turns"


def test_environment_other_than_the_runs_is_rejected(tmp_path: Path) -> None:
    other = EnvironmentConfig(name="guess_number")
    err = _reject(_write(tmp_path / "b.parquet"), tf.make_expect(environment=other))
    assert err.check == "metadata_environment"


def test_format_2_without_environment_is_rejected(tmp_path: Path) -> None:
    table = trajectories_table(tf.make_meta(), tf.make_samples())
    path = bf.write_table(tmp_path / "b.parquet", table, bf.make_meta(format_version=2))
    assert _reject(path).check == "metadata_environment"


def test_format_mismatch_between_metadata_and_columns(tmp_path: Path) -> None:
    table = trajectories_table(tf.make_meta(), tf.make_samples())
    path = bf.write_table(tmp_path / "b.parquet", table, bf.make_meta())
    assert _reject(path).check == "format_version"


def test_transcript_not_json_or_model_messages_missing(tmp_path: Path) -> None:
    def garble(values: list[str]) -> None:
        values[0] = "{not json"

    assert _reject(_doctored(_write(tmp_path / "a.parquet"), "transcript", garble)).check == (
        "transcript"
    )

    def drop_model(values: list[str]) -> None:
        messages = json.loads(values[0])
        values[0] = json.dumps([m for m in messages if m["kind"] != "model"])

    err = _reject(_doctored(_write(tmp_path / "b.parquet"), "transcript", drop_model))
    assert err.check == "trajectory" and "model messages" in err.detail


def test_tool_errors_above_tool_calls_are_rejected(tmp_path: Path) -> None:
    def more(values: list[int]) -> None:
        values[0] = 99

    err = _reject(_doctored(_write(tmp_path / "b.parquet"), "tool_errors", more))
    assert err.check == "trajectory" and "tool_errors" in err.detail


def test_prompt_spans_checked_against_the_learner(tmp_path: Path) -> None:
    path = _write(tmp_path / "b.parquet")
    other = {r: [1, 2, 3] for r in bf.PROMPT_ROWS}
    err = _reject(path, tf.make_expect(prompt_token_ids=other))
    assert (err.reason, err.check) == ("prompt_mismatch", "prompt_tokens")


def test_token_out_of_vocab_and_null_tokens(tmp_path: Path) -> None:
    def big(values: list[list[int]]) -> None:
        values[0][-1] = bf.VOCAB

    assert _reject(_doctored(_write(tmp_path / "a.parquet"), "token_ids", big)).check == (
        "token_out_of_vocab"
    )


def test_group_rows_checked(tmp_path: Path) -> None:
    samples = tf.make_samples()
    samples = [
        s for s in samples if not (s.prompt_row_id == bf.PROMPT_ROWS[0] and s.group_index == 0)
    ]
    path = tmp_path / "b.parquet"
    write_trajectory_batch(path, tf.make_meta(), samples)
    assert _reject(path).check in ("sample_count",)
