"""`asyncgrpo plan`: JSON and tables from the same arithmetic as the planner page; bad input
exits non-zero with a message naming it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from asyncgrpo.cli import app

BASE = [
    "plan",
    "--model",
    "qwen2.5-1.5b",
    "--micro-batch-tokens",
    "4096",
    "--learner-gpu",
    "H100:2.5:6000",
    "--worker-gpu",
    "L4:0.35:1500",
    "--worker-gpu",
    "A10G:0.45:1300",
    "--worker-sequences",
    "32",
    "--accept-fraction",
    "0.8",
]


def test_plan_json() -> None:
    result = CliRunner().invoke(app, [*BASE, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["payload"]["lora_params"] == 18_464_768  # test_fleet_plan.py, by hand
    assert out["memory"]["single"]["total"] == pytest.approx(16.324389888)
    l4 = next(r for r in out["fleet"] if r["gpu"] == "L4")
    assert l4["workers"] == 4 and l4["cost_per_1000_accepted"] == pytest.approx(0.138667, abs=1e-6)
    assert out["learner_gpu_memory_gb"] == 80


def test_plan_tables() -> None:
    result = CliRunner().invoke(app, BASE)
    assert result.exit_code == 0, result.output
    assert "Learner memory per GPU" in result.output and "fsdp+ckpt" in result.output
    assert "0.139" in result.output and "A10G" in result.output


def test_plan_from_a_config_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "vocab_size": 100,
            }
        )
    )
    result = CliRunner().invoke(app, ["plan", "--model", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["fleet"] == []  # no GPU offers: memory and payload only


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-5"], "unknown model 'gpt-5'"),
        (["--rank", "0"], "rank must be between 1 and 4096"),
        (["--targets", "mlp"], "unknown target set 'mlp'"),
        (["--worker-gpu", "L4:0.3"], "NAME:PRICE_PER_HOUR:TOKENS_PER_S"),
        (["--learner-gpu", "H100:2:x"], "must be numbers"),
        (["--accept-fraction", "0"], "accept_fraction must be in (0, 1]"),
        (["--micro-batch-tokens", "0"], "micro_batch_tokens must be 1 or more"),
    ],
)
def test_bad_input_exits_non_zero_with_a_message(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["plan", "--learner-gpu", "H100:2:100", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_worker_gpus_without_a_learner_are_refused() -> None:
    result = CliRunner().invoke(app, ["plan", "--worker-gpu", "L4:0.3:100"])
    assert result.exit_code == 2 and "need a learner GPU" in result.output
