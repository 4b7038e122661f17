"""Run creation refuses a reward that reads a reference column the dataset does not have, when
the columns are known from the config (generator, inline rows, an explicit reference_columns
mapping); stored datasets without a mapping are checked by the server."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from protocol.rewards import columns_read
from protocol.run_config import RunConfig

BASE: dict[str, Any] = {"name": "r", "base_model": "smollm2-135m-instruct"}
GEN = {"kind": "generator", "generator": "arithmetic", "size": 4}
UPLOADED = {"kind": "uploaded", "id": "00000000-0000-4000-8000-000000000001"}


def _config(dataset: dict[str, Any], *rewards: dict[str, Any], **over: Any) -> RunConfig:
    return RunConfig.model_validate({**BASE, "dataset": dataset, "rewards": list(rewards), **over})


def _refusal(dataset: dict[str, Any], *rewards: dict[str, Any], **over: Any) -> str:
    with pytest.raises(ValidationError) as info:
        _config(dataset, *rewards, **over)
    return str(info.value)


def test_columns_each_builtin_reads() -> None:
    assert columns_read("numeric_match", {}) == {"answer"}
    assert columns_read("math_verify", {}) == {"answer"}
    assert columns_read("math_verify", {"column": "solution"}) == {"solution"}
    assert columns_read("length_limit", {}) == set()
    assert columns_read("llm_judge", {"base_url": "http://x/v1", "model": "m"}) is None
    assert columns_read("my_rewards:score", {}) is None


def test_generator_columns_are_known() -> None:
    why = _refusal(GEN, {"name": "math_verify", "kwargs": {"column": "solution"}})
    assert "rewards.0 (math_verify) reads the reference column 'solution'" in why
    assert "its reference columns: answer" in why
    words = {"kind": "generator", "generator": "word_problems", "size": 4}
    _config(words, {"name": "math_verify", "kwargs": {"column": "solution"}})


def test_inline_rows_need_the_column_in_some_row() -> None:
    rows = [{"prompt": "a"}, {"prompt": "b", "style": "x"}]
    why = _refusal(
        {"kind": "jsonl", "rows": rows}, {"name": "length_limit"}, {"name": "numeric_match"}
    )
    assert "rewards.1 (numeric_match) reads the reference column 'answer'" in why
    assert "its reference columns: style" in why
    rows[0]["answer"] = "1"  # a row without it scores None for that reward, as in TRL
    _config({"kind": "jsonl", "rows": rows}, {"name": "numeric_match"})


def test_a_stored_mapping_is_checked_only_when_explicit() -> None:
    _config(UPLOADED, {"name": "numeric_match"})  # the server knows the columns
    _config({**UPLOADED, "reference_columns": ["answer"]}, {"name": "math_verify"})
    why = _refusal({**UPLOADED, "reference_columns": ["solution"]}, {"name": "math_verify"})
    assert "reads the reference column 'answer', which the dataset does not have" in why


def test_the_eval_dataset_is_checked_too() -> None:
    eval_block = {
        "dataset": {"kind": "jsonl", "rows": [{"prompt": "q", "solution": "1"}]},
        "accuracy_reward": "numeric_match",
    }
    why = _refusal(GEN, {"name": "numeric_match"}, eval=eval_block)
    assert "which the eval dataset does not have (its reference columns: solution)" in why
