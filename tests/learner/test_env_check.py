"""`env_mismatch`: the learner re-derives each environment turn from the transcript and re-runs
the calculator; trajectories rolled out by the real environments (a scripted policy on the real
SmolLM2 tokenizer, fallback syntax and a Qwen2.5-style tool template) pass, doctored ones fail."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from learner.env_check import EnvMismatch, check_trajectory
from lm.chat_turns import encode_text
from protocol.environments import EnvironmentConfig
from protocol.trajectories import Trajectory, TurnSpan, validate_trajectory
from tests.worker.environments.scripted import ScriptedEngine
from tests.worker.environments.test_tool_calls import QWEN25_TEMPLATE
from worker.environments.guess_number import GuessNumberEnvironment
from worker.environments.sandbox import ToolSandbox
from worker.environments.tool_calls import ToolCallsEnvironment

QUESTION = [{"role": "user", "content": "What is 123456789 * 987654321?"}]
PRODUCT = str(123456789 * 987654321)
TOOLS = EnvironmentConfig(name="tool_calls", tools=["calculator"], max_turns=4)


def call(expression: str) -> str:
    body = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(body)}\n</tool_call>"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[ToolSandbox]:
    with ToolSandbox(memory_mb=256) as box:
        yield box


def rollout(tokenizer: Any, sandbox: ToolSandbox, replies: list[str]) -> Trajectory:
    env = ToolCallsEnvironment(TOOLS, tokenizer, max_model_len=2048, sandbox=sandbox)
    t = env.rollout(ScriptedEngine(tokenizer, list(replies)), QUESTION, max_new_tokens=96)
    validate_trajectory(t, 2048)
    return t


REPLIES = [  # a call, a refused call and a malformed one, then the answer
    call("123456789 * 987654321") + "\n" + call("1/0"),
    "<tool_call>not json</tool_call>",
    f"It is {PRODUCT}.",
]


@pytest.fixture(params=["fallback", "template"])
def tokenizer(request: Any, small_tokenizer: Any) -> Any:
    if request.param == "fallback":
        return small_tokenizer
    qwen_like = copy.deepcopy(small_tokenizer)
    qwen_like.chat_template = QWEN25_TEMPLATE
    return qwen_like


def test_honest_trajectories_pass(tokenizer: Any, sandbox: ToolSandbox) -> None:
    t = rollout(tokenizer, sandbox, REPLIES)
    assert (t.model_turns, t.tool_calls, t.tool_errors) == (3, 3, 2)
    check_trajectory(t, tokenizer, TOOLS)


def doctor(tokenizer: Any, t: Trajectory, old: str, new: str, *, tokens: bool) -> Trajectory:
    """The trajectory with `old` replaced by `new` in its first tool result, in the transcript
    and (with `tokens`) in the environment span's tokens too, spans and mask re-cut to fit."""
    k = next(i for i, m in enumerate(t.messages) if m.kind == "tool_result")
    message = t.messages[k].model_copy(update={"content": t.messages[k].content.replace(old, new)})
    messages = [*t.messages[:k], message, *t.messages[k + 1 :]]
    if not tokens:
        return t.model_copy(update={"messages": messages})
    span = next(s for s in t.spans if s.kind == "environment")
    text = tokenizer.decode(t.token_ids[span.start : span.end], skip_special_tokens=False)
    assert old in text
    ids = encode_text(tokenizer, text.replace(old, new))
    shift = len(ids) - (span.end - span.start)
    token_ids = [*t.token_ids[: span.start], *ids, *t.token_ids[span.end :]]
    mask = [*t.loss_mask[: span.start], *[0] * len(ids), *t.loss_mask[span.end :]]
    logprobs = [*t.logprobs[: span.start], *[None] * len(ids), *t.logprobs[span.end :]]
    spans = [
        s
        if s.end <= span.start
        else TurnSpan(
            kind=s.kind,
            start=s.start if s.start <= span.start else s.start + shift,
            end=s.end + shift,
        )
        for s in t.spans
    ]
    out = t.model_copy(
        update={
            "messages": messages,
            "token_ids": token_ids,
            "loss_mask": mask,
            "logprobs": logprobs,
            "spans": spans,
        }
    )
    validate_trajectory(out, 2048)  # still a well-formed trajectory: only the story is false
    return out


def test_a_doctored_tool_result_is_env_mismatch(tokenizer: Any, sandbox: ToolSandbox) -> None:
    t = rollout(tokenizer, sandbox, REPLIES)
    wrong = str(int(PRODUCT) + 1)
    doctored = doctor(tokenizer, t, PRODUCT, wrong, tokens=True)
    with pytest.raises(EnvMismatch, match=r"calculator\(.*gives '121932631112635269'"):
        check_trajectory(doctored, tokenizer, TOOLS)


def test_a_transcript_that_disagrees_with_its_tokens_is_env_mismatch(
    tokenizer: Any, sandbox: ToolSandbox
) -> None:
    t = rollout(tokenizer, sandbox, REPLIES)
    doctored = doctor(tokenizer, t, PRODUCT, "42", tokens=False)
    with pytest.raises(EnvMismatch, match="environment turn's tokens are not its messages"):
        check_trajectory(doctored, tokenizer, TOOLS)
    model = next(i for i, m in enumerate(t.messages) if m.kind == "model")
    edited = t.messages[model].model_copy(update={"content": "I will not call anything."})
    lying = t.model_copy(
        update={"messages": [*t.messages[:model], edited, *t.messages[model + 1 :]]}
    )
    with pytest.raises(EnvMismatch, match="model message is not the text of its tokens"):
        check_trajectory(lying, tokenizer, TOOLS)


def test_a_dropped_tool_result_is_env_mismatch(tokenizer: Any, sandbox: ToolSandbox) -> None:
    t = rollout(tokenizer, sandbox, REPLIES)
    k = next(i for i, m in enumerate(t.messages) if m.kind == "model")
    recorded = t.messages[k].model_copy(update={"tool_calls": t.messages[k].tool_calls[:1]})
    fewer = t.model_copy(update={"messages": [*t.messages[:k], recorded, *t.messages[k + 1 :]]})
    with pytest.raises(EnvMismatch, match="1 recorded tool calls, 2 results"):
        check_trajectory(fewer, tokenizer, TOOLS)


def test_guess_game_and_single_turn_pass(small_tokenizer: Any) -> None:
    config = EnvironmentConfig(name="guess_number", kwargs={"low": 1, "high": 9}, max_turns=3)
    env = GuessNumberEnvironment(config, small_tokenizer, max_model_len=2048)
    engine = ScriptedEngine(small_tokenizer, ["5", "I think 3", "no idea"])
    t = env.rollout(engine, [{"role": "user", "content": "Play!"}], max_new_tokens=16, seed=1)
    assert t.model_turns >= 2
    check_trajectory(t, small_tokenizer, config)
    feedback = next(i for i, m in enumerate(t.messages) if m.kind == "feedback")
    flipped = "Lower." if t.messages[feedback].content == "Higher." else "Higher."
    edited = t.messages[feedback].model_copy(update={"content": flipped})
    lie = t.model_copy(
        update={"messages": [*t.messages[:feedback], edited, *t.messages[feedback + 1 :]]}
    )
    with pytest.raises(EnvMismatch):
        check_trajectory(lie, small_tokenizer, config)
