"""The run config's eval block: defaults, and one case per rule with the field path and the
message."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from protocol.run_config import RunConfig
from tests.protocol.test_run_config import base, errors_of

EVAL: dict[str, Any] = {
    "dataset": {"kind": "generator", "generator": "arithmetic", "size": 10, "seed": 1},
    "accuracy_reward": "numeric_match",
}


def with_eval(**fields: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(base())
    cfg["eval"] = {**copy.deepcopy(EVAL), **fields}
    return cfg


def test_defaults_and_no_eval() -> None:
    assert RunConfig.model_validate(base()).eval is None
    ev = RunConfig.model_validate(with_eval()).eval
    assert ev is not None
    assert (ev.every_versions, ev.n, ev.temperature, ev.threshold) == (1, 1, 0.0, 1.0)
    assert ev.max_leases_in_flight == 2 and ev.max_new_tokens is None
    assert ev.n_prompts() == 10
    assert RunConfig.model_validate(with_eval(max_prompts=3)).eval.n_prompts() == 3  # type: ignore[union-attr]
    inline = {"kind": "jsonl", "rows": [{"prompt": "1 + 1?", "answer": "2"}]}
    assert RunConfig.model_validate(with_eval(dataset=inline, n=4, temperature=0.8)).eval


CASES = [
    ({"temperature": 0.0, "n": 2}, "eval.temperature", "temperature 0 is greedy decoding"),
    ({"temperature": -0.5}, "eval.temperature", "temperature must be at least 0"),
    ({"every_versions": 0}, "eval.every_versions", "every_versions must be between 1"),
    ({"n": 0}, "eval.n", "n must be between 1 and 1024"),
    ({"max_prompts": 0}, "eval.max_prompts", "max_prompts must be between 1"),
    ({"max_new_tokens": 0}, "eval.max_new_tokens", "max_new_tokens must be between 1"),
    ({"max_leases_in_flight": 0}, "eval.max_leases_in_flight", "must be between 1 and 1024"),
    ({"accuracy_reward": "hash_score"}, "eval", "eval.accuracy_reward must name one of the run"),
    ({"bogus": 1}, "eval.bogus", "Extra inputs are not permitted"),
    (
        {"dataset": {"kind": "generator", "size": 100_001}},
        "eval.max_prompts",
        "max_prompts must be set when the eval dataset has more than 100,000 rows",
    ),
    ({"dataset": {"kind": "generator", "size": 0}}, "eval.dataset.generator.size", "size must"),
]


@pytest.mark.parametrize(("fields", "loc", "message"), CASES)
def test_each_rule_names_its_field(fields: dict[str, Any], loc: str, message: str) -> None:
    errors = errors_of(with_eval(**fields))
    assert any(path == loc and message in msg for path, msg, _ in errors), errors


def test_accuracy_reward_names_the_rewards_and_the_value() -> None:
    errors = errors_of(with_eval(accuracy_reward="nope"))
    assert any("(numeric_match)" in msg and "'nope'" in msg for _p, msg, _t in errors), errors


def test_the_eval_example_is_valid_and_round_trips() -> None:
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "runs" / "arithmetic-eval.json"
    raw = json.loads(path.read_text())
    cfg = RunConfig.model_validate(raw)
    assert cfg.eval is not None and cfg.eval.n_prompts() == 32
    assert cfg.model_dump(mode="json") == raw
