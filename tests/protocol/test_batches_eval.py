"""Eval batches: the same file format with null behaviour log-probs and `kind: eval` in the
footer; the validating reader accepts them only as eval batches, and still refuses a training
batch without log-probs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from protocol.batches import BatchRejected, read_batch, write_batch
from tests.protocol.batch_factory import MAX_NEW, make_expect, make_meta, make_samples


def _eval_samples() -> list:  # type: ignore[type-arg]
    return [replace(s, behaviour_logprobs=None) for s in make_samples()]


def test_an_eval_batch_without_logprobs_is_read_as_eval(tmp_path: Path) -> None:
    path = tmp_path / "eval.parquet"
    write_batch(path, make_meta(kind="eval"), _eval_samples())
    data = read_batch(path, make_expect(kind="eval"))
    assert data.metadata.kind == "eval"
    assert data.n_samples == len(make_samples())
    assert all(lp == [] for lp in data.behaviour_logprobs)
    assert all(len(c) <= MAX_NEW for c in data.completion_token_ids)


def test_a_training_batch_without_logprobs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    write_batch(path, make_meta(), _eval_samples())
    with pytest.raises(BatchRejected) as info:
        read_batch(path, make_expect())
    assert info.value.check == "nulls" and "behaviour_logprobs" in info.value.detail


def test_an_eval_batch_is_not_a_training_batch_and_back(tmp_path: Path) -> None:
    eval_path = tmp_path / "eval.parquet"
    write_batch(eval_path, make_meta(kind="eval"), _eval_samples())
    with pytest.raises(BatchRejected) as info:
        read_batch(eval_path, make_expect())
    assert info.value.check == "metadata_kind"
    train_path = tmp_path / "train.parquet"
    write_batch(train_path, make_meta(), make_samples())
    with pytest.raises(BatchRejected) as info:
        read_batch(train_path, make_expect(kind="eval"))
    assert info.value.check == "metadata_kind"


def test_an_eval_batch_that_carries_logprobs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "eval.parquet"
    write_batch(path, make_meta(kind="eval"), make_samples())
    with pytest.raises(BatchRejected) as info:
        read_batch(path, make_expect(kind="eval"))
    # the footer's value count already shows log-probs where none may be
    assert info.value.reason == "invalid"
    assert info.value.check in ("list_too_long", "eval_logprobs")


def test_an_old_training_batch_without_kind_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "old.parquet"
    write_batch(path, make_meta(), make_samples())
    assert read_batch(path, make_expect()).metadata.kind == "train"
