"""bench/environments.py: its arguments, the run config it makes, how it counts a correct
calculator call, and part 1 on the real small model with one prompt (the full benchmark is not
CI)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bench.environments import correct_call, main, parse_args, product_asked, products_config
from protocol.run_config import GeneratorDataset, RunConfig
from protocol.trajectories import ToolCall


def test_products_config_validates_as_a_tool_calls_run() -> None:
    config = RunConfig.model_validate(products_config(12, 0, 512))
    assert config.environment.name == "tool_calls"
    assert config.environment.tools == ["calculator"]
    assert config.environment.max_turns == 3
    assert config.max_versions == 12
    assert isinstance(config.dataset, GeneratorDataset)
    assert config.dataset.generator == "products"


def test_arguments_are_checked() -> None:
    assert parse_args([]).versions == 12
    with pytest.raises(SystemExit):
        parse_args(["--max-new-tokens", "600", "--max-total-tokens", "512"])


def _message(*calls: tuple[str, dict[str, object]]) -> SimpleNamespace:
    return SimpleNamespace(tool_calls=[ToolCall(name=n, arguments=a) for n, a in calls])


def test_a_correct_call_is_one_whose_expression_is_worth_the_product() -> None:
    product = 48213 * 9177
    assert correct_call([_message(("calculator", {"expression": "48213 * 9177"}))], product)
    assert correct_call(
        [_message(("calculator", {"expression": "1/0"})),
         _message(("calculator", {"expression": "9177*48213"}))], product,
    )  # fmt: skip
    assert not correct_call([_message(("calculator", {"expression": "48213 + 9177"}))], product)
    assert not correct_call([_message(("other", {"expression": "48213 * 9177"}))], product)
    assert not correct_call([_message(("calculator", {"expression": 3}))], product)
    assert not correct_call([SimpleNamespace(tool_calls=[])], product)


def test_the_product_comes_from_the_prompt_message() -> None:
    def msg(kind: str, content: str) -> SimpleNamespace:
        return SimpleNamespace(kind=kind, content=content)

    system = msg("prompt", "You are a helpful assistant. What is 2 * 3? (an example)")
    asked = msg("prompt", "What is 48213 * 9177? Answer with just the number.")
    assert product_asked([system, asked, msg("model", "What is 1 * 1?")]) == 48213 * 9177
    assert product_asked([msg("prompt", "What is 2 + 3?")]) is None
    assert product_asked([]) is None


@pytest.mark.integration  # the real model and the tool sandbox
@pytest.mark.timeout(120)
def test_throughput_part_on_the_small_model(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--part", "throughput", "--prompts", "1", "--group-size", "1",
            "--max-new-tokens", "8", "--repeats", "1", "--threads", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for name in ("single_turn", "tool_calls"):
        row = figures["throughput"][name]
        assert row["runs"][0]["trajectories"] == 1
        assert 0 < row["runs"][0]["trained_tokens"] <= 3 * 8
        assert row["trajectories_per_s"] > 0
    assert figures["tool_calls_vs_single_turn_trajectories"] > 0
