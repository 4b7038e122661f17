"""A pool learner's memory payload (learner/pool_memory.py): the real small model's shape from
its config.json, the budget (--memory-budget, else the machine's memory on CPU), the dtype's
width; a model whose shape is unknown takes without a memory check; each left run logged once."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from learner import pool_memory
from learner.config import LearnerSettings
from protocol.learner_memory import ModelShape
from protocol.schemas_learner import LeftRun

SERVER = "http://h:1"


def _settings(**fields: Any) -> LearnerSettings:
    return LearnerSettings(server_url=SERVER, run_id=str(uuid.uuid4()), token="t", **fields)


def _mem_total_bytes() -> int:
    line = next(
        x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")
    )
    return int(line.split()[1]) * 1024


def test_the_payload_of_the_small_model(small_model_dir: str) -> None:
    # SmolLM2-135M's config.json: 30 layers, hidden 576, MLP 1536, 9 heads, 3 KV heads of 64,
    # vocabulary 49,152, tied embeddings, no attention bias
    sent = pool_memory.take_memory(_settings(memory_budget=12.5, dtype="bfloat16"))
    assert sent is not None
    shape = (sent.layers, sent.hidden, sent.intermediate, sent.heads, sent.kv_heads, sent.vocab)
    assert shape == (30, 576, 1536, 9, 3, 49152)
    assert sent.tied_embeddings and not sent.attention_bias and not sent.qk_norm
    assert (sent.budget_gb, sent.weight_bytes) == (12.5, 2)
    expected = ModelShape(small_model_dir, *shape, True, False, explicit_head_dim=64)
    assert pool_memory.model_shape(small_model_dir) == expected
    fp32 = pool_memory.take_memory(_settings(memory_budget=1))
    assert fp32 is not None and fp32.weight_bytes == 4  # the learner's default --dtype float32


def test_the_budget_on_cpu_is_the_machines_memory() -> None:
    assert pool_memory.budget_gb(_settings()) == pytest.approx(_mem_total_bytes() / 1e9)
    assert pool_memory.budget_gb(_settings(memory_budget=3.5)) == 3.5


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), 100_001, "lots"])
def test_memory_budget_is_bounded(bad: object) -> None:
    with pytest.raises(ValidationError, match="memory_budget"):
        _settings(memory_budget=bad)


def test_an_unknown_shape_takes_without_a_memory_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="learner"):
        assert pool_memory.take_memory(_settings(model=str(tmp_path))) is None  # no config.json
    assert "no memory check on takes" in caplog.text


def test_each_left_run_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    said: set[uuid.UUID] = set()
    with caplog.at_level(logging.INFO, logger="learner"):
        pool_memory.log_left([LeftRun(run_id=a, reason="needs 1.0 GB more")], said)
        pool_memory.log_left(
            [LeftRun(run_id=a, reason="needs 1.0 GB more"), LeftRun(run_id=b, reason="r")], said
        )
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"left run {a} for another learner: needs 1.0 GB more",
        f"left run {b} for another learner: r",
    ]
