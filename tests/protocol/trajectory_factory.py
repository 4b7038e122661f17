"""Builders of valid format 2 (trajectory) batches and their expectations."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from protocol.batch_format import BatchMetadata, TrajectorySample
from protocol.batch_reader import BatchExpectations
from protocol.environments import EnvironmentConfig
from protocol.trajectories import ToolCall, Trajectory, TranscriptMessage, TurnSpan
from tests.protocol import batch_factory as bf

ENV = EnvironmentConfig(name="tool_calls", tools=["calculator"], max_turns=3, max_total_tokens=64)


def env_json(env: EnvironmentConfig = ENV) -> dict[str, Any]:
    return env.model_dump(mode="json")


def make_meta(**over: Any) -> BatchMetadata:
    fields: dict[str, Any] = {"format_version": 2, "environment": env_json()}
    fields.update(over)
    return bf.make_meta(**fields)


def trajectory(row_id: int, rng: random.Random, turns: int = 2) -> Trajectory:
    """prompt, then model/environment turns alternating, ending on a model turn."""
    tokens = list(bf.prompt_of(row_id))
    spans = [TurnSpan(kind="prompt", start=0, end=len(tokens))]
    logprobs: list[float | None] = [None] * len(tokens)
    messages = [TranscriptMessage(role="user", content=f"row {row_id}", kind="prompt")]
    for turn in range(turns):
        if turn:
            env = [rng.randrange(bf.VOCAB) for _ in range(rng.randint(1, 4))]
            spans.append(
                TurnSpan(kind="environment", start=len(tokens), end=len(tokens) + len(env))
            )
            tokens += env
            logprobs += [None] * len(env)
            messages.append(
                TranscriptMessage(role="user", content="42", kind="tool_result", name="calculator")
            )
        model = [rng.randrange(bf.VOCAB) for _ in range(rng.randint(1, 6))]
        spans.append(TurnSpan(kind="model", start=len(tokens), end=len(tokens) + len(model)))
        tokens += model
        logprobs += [-rng.random() * 5 for _ in model]
        calls = [ToolCall(name="calculator", arguments={"expression": "6*7"})]
        messages.append(
            TranscriptMessage(
                role="assistant",
                content="x",
                kind="model",
                tool_calls=calls if turn < turns - 1 else [],
            )
        )
    return Trajectory(
        token_ids=tokens,
        loss_mask=[0 if lp is None else 1 for lp in logprobs],
        logprobs=logprobs,
        spans=spans,
        messages=messages,
        stop_reason="done",
        tool_calls=turns - 1,
        tool_errors=0,
        info={"row": row_id},
    )


def make_samples(seed: int = 0, eval_batch: bool = False) -> list[TrajectorySample]:
    rng = random.Random(seed)
    out = [
        TrajectorySample(row_id, g, trajectory(row_id, rng, turns=1 + (g % 3)))
        for row_id in bf.PROMPT_ROWS
        for g in range(bf.GROUP)
    ]
    rng.shuffle(out)
    return out


def make_expect(**over: Any) -> BatchExpectations:
    return replace(bf.make_expect(environment=ENV, max_new_tokens=6), **over)
