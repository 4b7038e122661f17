"""EnvironmentConfig rules (one case per rule: field path and message) and the trajectory
validator (every invariant broken once, each with its reason)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from protocol.environments import EnvironmentAllowlist, EnvironmentConfig
from protocol.trajectories import (
    Trajectory,
    TrajectoryError,
    TranscriptMessage,
    TurnSpan,
    validate_trajectory,
)


def errors(**fields: Any) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        EnvironmentConfig.model_validate(fields)
    return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in info.value.errors()]


def test_defaults_are_single_turn() -> None:
    config = EnvironmentConfig()
    assert (config.name, config.tools, config.turns, config.max_total_tokens) == (
        "single_turn",
        [],
        1,
        None,
    )
    tool = EnvironmentConfig(name="tool_calls", tools=["calculator"], max_total_tokens=1024)
    assert tool.turns == 4 and tool.tool_timeout_s == 5.0


@pytest.mark.parametrize(
    ("fields", "path", "needle"),
    [
        ({"name": "tool_call"}, "name", "did you mean 'tool_calls'?"),
        ({"name": "os:system"}, "name", "standard library"),
        ({"name": "bad name!"}, "name", "unknown environment 'bad name!'"),
        ({"name": "tool_calls"}, "", "tool_calls needs at least one built-in tool"),
        ({"name": "tool_calls", "tools": ["web"]}, "", "unknown: web"),
        ({"name": "tool_calls", "tools": ["calculator", "calculator"]}, "tools", "more than"),
        ({"name": "tool_calls", "tools": ["rm -rf"]}, "tools", "is not a tool name"),
        ({"tools": ["calculator"]}, "", "single_turn calls no tools"),
        ({"max_turns": 3}, "", "single_turn has exactly one model turn (got 3)"),
        ({"name": "guess_number", "max_turns": 0}, "max_turns", "between 1 and 64 (got 0)"),
        ({"max_total_tokens": 1}, "max_total_tokens", "between 2 and"),
        ({"max_total_tokens": 512}, "", "single_turn is bounded by sampling.max_new_tokens"),
        ({"tool_timeout_s": 0}, "tool_timeout_s", "above 0 and at most 60 (got 0"),
        ({"tool_timeout_s": 61}, "tool_timeout_s", "at most 60"),
        ({"kwargs": {"x": 1}}, "", "single_turn takes no kwargs"),
        ({"name": "guess_number", "kwargs": {"low": 5, "high": 5}}, "", "low < high"),
        ({"name": "guess_number", "kwargs": {"low": "a"}}, "", "kwargs.low must be an integer"),
        ({"name": "guess_number", "kwargs": {"max": 3}}, "", "takes only low, high"),
        ({"surprise": 1}, "surprise", "Extra inputs are not permitted"),
    ],
)
def test_rules(fields: dict[str, Any], path: str, needle: str) -> None:
    found = errors(**fields)
    assert any(p == path and needle in msg for p, msg in found), found


def test_user_environments_pass_syntax_only() -> None:
    assert EnvironmentConfig(name="my_envs.games:Chess", tools=["board"]).turns == 4
    assert EnvironmentConfig(name="chess-v2", kwargs={"depth": 2}).name == "chess-v2"


def test_allowlist() -> None:
    allowed = EnvironmentAllowlist(frozenset({"my_envs"}), {"chess": "my_envs.games:Chess"})
    assert allowed.allows("tool_calls") and allowed.allows("chess")
    assert allowed.allows("my_envs:Other") and not allowed.allows("other_envs:Other")
    assert not allowed.allows("my_envs.sub:Other")  # only the module listed, not its children
    assert allowed.names() == ["single_turn", "tool_calls", "guess_number", "chess", "my_envs:*"]


# -- trajectories ---------------------------------------------------------------------------


def good() -> dict[str, Any]:
    """prompt 0:3, model 3:5, environment 5:7, model 7:8."""
    return {
        "token_ids": [1, 2, 3, 10, 11, 20, 21, 12],
        "loss_mask": [0, 0, 0, 1, 1, 0, 0, 1],
        "logprobs": [None, None, None, -0.1, -0.2, None, None, -0.3],
        "spans": [
            TurnSpan(kind="prompt", start=0, end=3),
            TurnSpan(kind="model", start=3, end=5),
            TurnSpan(kind="environment", start=5, end=7),
            TurnSpan(kind="model", start=7, end=8),
        ],
        "messages": [
            TranscriptMessage(role="user", content="q", kind="prompt"),
            TranscriptMessage(role="assistant", content="a", kind="model"),
            TranscriptMessage(role="tool", content="r", kind="tool_result", name="calculator"),
            TranscriptMessage(role="assistant", content="b", kind="model"),
        ],
        "stop_reason": "done",
        "tool_calls": 1,
    }


def test_valid_trajectory() -> None:
    t = Trajectory(**good())
    validate_trajectory(t, max_total_tokens=8)
    assert (t.prompt_tokens, t.model_turns, t.trained_tokens) == (3, 2, 3)


def broken(**changes: Any) -> str:
    t = Trajectory(**{**good(), **changes})
    with pytest.raises(TrajectoryError) as info:
        validate_trajectory(t, max_total_tokens=8)
    return str(info.value)


def test_validator_reasons() -> None:
    g = good()
    assert "one entry per token (8)" in broken(loss_mask=g["loss_mask"][:-1])
    assert "loss_mask[5] is 1 in a environment span" in broken(loss_mask=[0, 0, 0, 1, 1, 1, 0, 1])
    assert "logprobs[4] must be a finite log-prob" in broken(
        logprobs=[None, None, None, -0.1, None, None, None, -0.3]
    )
    assert "logprobs[4] must be a finite log-prob <= 0 (got 0.5)" in broken(
        logprobs=[None, None, None, -0.1, 0.5, None, None, -0.3]
    )
    assert "logprobs[6] must be None outside model spans" in broken(
        logprobs=[None, None, None, -0.1, -0.2, None, -1.0, -0.3]
    )
    spans = list(g["spans"])
    spans[2] = TurnSpan(kind="environment", start=6, end=7)
    assert "start where the previous one ends (5)" in broken(spans=spans)
    assert "spans cover 7 tokens, the trajectory has 8" in broken(spans=g["spans"][:3])
    assert "must start with the prompt span" in broken(spans=g["spans"][1:])
    assert "9 tokens exceed max_total_tokens 8" in broken(
        token_ids=[*g["token_ids"], 13],
        loss_mask=[*g["loss_mask"], 1],
        logprobs=[*g["logprobs"], -0.1],
        spans=[*g["spans"][:3], TurnSpan(kind="model", start=7, end=9)],
    )
    assert "3 model messages for 2 model spans" in broken(
        messages=[*g["messages"], TranscriptMessage(role="assistant", content="c", kind="model")]
    )
    assert "tool_errors (2) cannot exceed tool_calls (1)" in broken(tool_errors=2)


def test_unknown_stop_reason_and_fields_refused() -> None:
    with pytest.raises(ValidationError):
        Trajectory(**{**good(), "stop_reason": "bored"})
    with pytest.raises(ValidationError):
        Trajectory(**{**good(), "reward": 1.0})
