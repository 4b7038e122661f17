"""RunConfig.environment: the default (single_turn), a multi-turn environment, the run-level
rule between sampling and the environment's token budget, and the learner's config."""

from __future__ import annotations

from typing import Any

from protocol.environments import EnvironmentConfig
from protocol.run_config import LearnerRunConfig, RunConfig
from tests.protocol.test_run_config import base, errors_of

TOOLS = {"name": "tool_calls", "tools": ["calculator"], "max_turns": 4, "max_total_tokens": 1024}


def _with_env(env: dict[str, Any], max_new_tokens: int = 32) -> dict[str, Any]:
    cfg = base()
    cfg["environment"] = env
    cfg["sampling"]["max_new_tokens"] = max_new_tokens
    return cfg


def test_the_default_is_single_turn() -> None:
    cfg = base()
    del cfg["environment"]
    run = RunConfig.model_validate(cfg)
    assert run.environment == EnvironmentConfig()
    assert not run.multi_turn and not run.environment.requires_trusted_worker


def test_a_tool_calls_run() -> None:
    run = RunConfig.model_validate(_with_env(TOOLS))
    assert run.multi_turn and run.environment.turns == 4
    assert run.model_dump(mode="json")["environment"]["tools"] == ["calculator"]
    learner = LearnerRunConfig.model_validate(run.for_learner())
    assert learner.environment == run.environment


def test_max_new_tokens_must_fit_the_token_budget() -> None:
    errors = errors_of(_with_env({**TOOLS, "max_total_tokens": 64}, max_new_tokens=64))
    assert [(loc, typ) for loc, _m, typ in errors] == [("environment", "config_rule")]
    assert (
        "environment.max_total_tokens (64) must be above sampling.max_new_tokens (64)"
        in (errors[0][1])
    )
    RunConfig.model_validate(_with_env({**TOOLS, "max_total_tokens": 65}, max_new_tokens=64))


def test_environment_errors_carry_their_path() -> None:
    errors = errors_of(_with_env({"name": "tool_calls", "tools": []}))
    assert errors[0][0] == "environment"
    assert "tool_calls needs at least one built-in tool" in errors[0][1]
    errors = errors_of(_with_env({"name": "single_turn", "color": "red"}))
    assert errors[0][0] == "environment.color"


def test_requires_trusted_worker() -> None:
    run = RunConfig.model_validate(
        _with_env({"name": "guess_number", "requires_trusted_worker": True})
    )
    assert run.environment.requires_trusted_worker
    assert errors_of(_with_env({"name": "guess_number", "requires_trusted_worker": "maybe"}))
