"""Re-derive a trajectory's environment turns from its transcript (`env_mismatch`).

The transcript is written by an untrusted worker, and rewards read it. So before a batch is
scored, the learner checks that the transcript and the tokens tell the same story:
- the prompt messages render to the prompt span's tokens (lm/chat_turns.py `prompt_ids`, with
  the tools' schemas when the template has a tool format);
- each model message is the text of its model span's tokens (its EOS excluded when it ended
  on a special token, as the worker records it);
- each environment span is exactly the tokens of `environment_segment(history, the messages
  the environment added)` (lm/chat_turns.py: the same function the worker used);
- each call of a deterministic tool (the calculator) recorded on a model message is run again,
  and its result or error must be the one the transcript shows (lm/chat_turns.py
  `tool_message` writes it the worker's way).
The first difference raises `EnvMismatch` naming it. Nothing here trusts the worker's counts
or `info`: those are checked elsewhere (protocol/trajectories.py) or not used for training.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lm.chat_turns import (
    encode_text,
    environment_segment,
    function_schema,
    prompt_ids,
    template_has_tool_format,
    tool_message,
)
from protocol import calculator
from protocol.environments import TOOL_CALLS, EnvironmentConfig
from protocol.trajectories import Trajectory, TranscriptMessage

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Tools whose output depends only on their arguments: re-run by the learner.
DETERMINISTIC_TOOLS: dict[str, tuple[Callable[..., str], type[Exception]]] = {
    "calculator": (calculator.calculator, calculator.CalculatorError),
}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "calculator": function_schema("calculator", calculator.DESCRIPTION, calculator.SCHEMA),
}


class EnvMismatch(ValueError):
    """The transcript and the tokens of a trajectory disagree; the message says where."""


def template_tools(
    tokenizer: PreTrainedTokenizerBase, environment: EnvironmentConfig
) -> list[dict[str, Any]] | None:
    """The `tools` the worker gave the template: the tools' schemas for a template with a tool
    format under `tool_calls`, else None (the fallback describes them in the system message)."""
    if environment.name != TOOL_CALLS or not template_has_tool_format(tokenizer):
        return None
    return [TOOL_SCHEMAS[name] for name in environment.tools if name in TOOL_SCHEMAS]


def check_trajectory(
    t: Trajectory, tokenizer: PreTrainedTokenizerBase, environment: EnvironmentConfig
) -> None:
    """Raise EnvMismatch unless the transcript re-derives the trajectory's tokens and tool
    results (see the module docstring). `t` has passed `validate_trajectory`."""
    tools = template_tools(tokenizer, environment)
    template_format = tools is not None
    prompt = [m for m in t.messages if m.kind == "prompt"]
    if t.messages[: len(prompt)] != prompt:
        raise EnvMismatch("the transcript's prompt messages must come first")
    rendered: list[dict[str, Any]] = [_rendered(m) for m in prompt]
    if prompt_ids(tokenizer, rendered, tools) != t.token_ids[: t.prompt_tokens]:
        raise EnvMismatch("the prompt span is not the transcript's prompt messages rendered")
    turns = _turns(t.messages[len(prompt) :])
    model_spans = [s for s in t.spans if s.kind == "model"]
    environment_spans = [s for s in t.spans if s.kind == "environment"]
    if len(turns) != len(model_spans):
        raise EnvMismatch(f"{len(turns)} model messages for {len(model_spans)} model turns")
    for k, ((message, added), span) in enumerate(zip(turns, model_spans, strict=True)):
        ids = t.token_ids[span.start : span.end]
        follows = k < len(environment_spans) and environment_spans[k].start == span.end
        ending = _check_model_text(tokenizer, message, ids, k)
        history = list(rendered)
        rendered.append({"role": "assistant", "content": message.content})
        if not follows:
            if added:
                raise EnvMismatch(f"turn {k}: environment messages without an environment turn")
            continue
        env = environment_spans[k]
        if not added:
            raise EnvMismatch(f"turn {k}: an environment turn without environment messages")
        new = [_rendered(m) for m in added]
        text = environment_segment(tokenizer, history, new, ending, tools)
        if encode_text(tokenizer, text) != t.token_ids[env.start : env.end]:
            raise EnvMismatch(f"turn {k}: the environment turn's tokens are not its messages")
        _check_tool_results(message, added, k, template_format)
        rendered.extend(new)


def _turns(
    messages: Sequence[TranscriptMessage],
) -> list[tuple[TranscriptMessage, list[TranscriptMessage]]]:
    """(model message, the environment messages after it) per model turn."""
    turns: list[tuple[TranscriptMessage, list[TranscriptMessage]]] = []
    for m in messages:
        if m.kind == "model":
            turns.append((m, []))
        elif m.kind == "prompt" or not turns:
            raise EnvMismatch(f"a {m.kind} message where the transcript needs a model message")
        else:
            turns[-1][1].append(m)
    return turns


def _check_model_text(
    tokenizer: PreTrainedTokenizerBase,
    message: TranscriptMessage,
    ids: list[int],
    k: int,
) -> str:
    """The model turn's ending (its EOS text) when the message is its tokens' text less a
    final special token (the turn stopped on it); "" when it is the text of every token (a
    turn cut by length). EnvMismatch when it is neither."""
    decode = lambda part: str(tokenizer.decode(part, skip_special_tokens=False))  # noqa: E731
    if ids[-1] in set(tokenizer.all_special_ids) and message.content == decode(ids[:-1]):
        return decode(ids[-1:])
    if message.content == decode(ids):
        return ""
    raise EnvMismatch(f"turn {k}: the model message is not the text of its tokens")


def _check_tool_results(
    message: TranscriptMessage, added: Sequence[TranscriptMessage], k: int, template_format: bool
) -> None:
    """Re-run each deterministic tool call of the turn and compare with what the transcript
    shows. The calls a message records are the well-formed ones, in order; a malformed call's
    error message has no tool name, so the named messages pair with the recorded calls."""
    named = [m for m in added if m.kind in ("tool_result", "tool_error") and m.name is not None]
    if len(named) != len(message.tool_calls):
        raise EnvMismatch(
            f"turn {k}: {len(message.tool_calls)} recorded tool calls, {len(named)} results"
        )
    for call, shown in zip(message.tool_calls, named, strict=True):
        if call.name != shown.name:
            raise EnvMismatch(f"turn {k}: a result of {shown.name!r} for a call of {call.name!r}")
        if call.name not in DETERMINISTIC_TOOLS:
            continue
        expected = _run(call.name, call.arguments)
        if expected is None:
            continue
        result, error = expected
        want = tool_message(call.name, result=result, error=error, template_format=template_format)
        if (shown.role, shown.content, shown.kind) != (want.role, want.content, want.kind):
            raise EnvMismatch(
                f"turn {k}: {call.name}({_short(call.arguments)}) gives "
                f"{_short(result if error is None else error)!s}, the transcript shows "
                f"{_short(shown.content)}"
            )


def _run(name: str, arguments: Mapping[str, Any]) -> tuple[str | None, str | None] | None:
    """(result, None) or (None, the tool's refusal); None when the tool failed otherwise (an
    error the worker's sandbox words its own way: not comparable)."""
    fn, refused = DETERMINISTIC_TOOLS[name]
    try:
        return fn(**arguments), None
    except refused as exc:
        return None, str(exc)
    except Exception:  # noqa: BLE001 - e.g. arguments the worker's schema check let through
        return None


def _rendered(message: TranscriptMessage) -> dict[str, Any]:
    """A message as the worker gave it to the template (worker/environments/base.py)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name is not None:
        out["name"] = message.name
    return out


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
