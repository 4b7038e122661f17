"""Tools, and how a model calls them: its chat template's tool format, or the fallback syntax.

The call syntax is the same in both cases, Qwen2.5/Hermes style:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12345 * 6789"}}
    </tool_call>

- Template format: a chat template that takes `tools` and shows `<tool_call>` (Qwen2.5,
  Hermes-style templates) describes the tools itself (`tools=` given to the template) and
  renders results as `tool` messages in its own way (`<tool_response>` blocks).
- Fallback (templates without a tool format, e.g. SmolLM2): the tools and this syntax are
  described in the system message (`fallback_instructions`, added to the prompt's system
  message, or as one), and each result comes back as a `user` message
  `<tool_response>\n{"name": …, "result" | "error": …}\n</tool_response>`.
A model turn with no `<tool_call>` is the answer. A call that cannot be used (unclosed tag,
not JSON, no name, an unknown tool, arguments that do not fit the tool's schema) gets a
`tool_error` message saying what was wrong, and the model may try again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lm.chat_turns import TOOL_CALL_OPEN, function_schema
from protocol.trajectories import ToolCall
from worker.environments import calculator

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN, CLOSE = TOOL_CALL_OPEN, "</tool_call>"
MAX_CALLS_PER_TURN = 8


@dataclass(frozen=True)
class Tool:
    """A tool: `fn` is a module-level function (it runs in the sandbox's children) that takes
    the arguments as keywords and returns text."""

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of an object
    fn: Callable[..., str]

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema chat templates take as `tools`."""
        return function_schema(self.name, self.description, self.parameters)


BUILTIN_TOOLS: dict[str, Tool] = {
    "calculator": Tool(
        "calculator", calculator.DESCRIPTION, calculator.SCHEMA, calculator.calculator
    )
}


def fallback_instructions(tools: Sequence[Tool]) -> str:
    described = "\n".join(json.dumps(t.schema()["function"]) for t in tools)
    return (
        "You can call these tools:\n"
        f"{described}\n"
        "To call one, write exactly:\n"
        '<tool_call>\n{"name": "TOOL_NAME", "arguments": {...}}\n</tool_call>\n'
        "and stop; the result comes back in <tool_response></tool_response>. "
        "When you know the answer, reply without a tool call."
    )


def with_instructions(
    messages: Sequence[Mapping[str, Any]], instructions: str
) -> list[dict[str, Any]]:
    """The prompt with `instructions` appended to its system message (or as a new first one)."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{instructions}"
        return out
    return [{"role": "system", "content": instructions}, *out]


class CallError(ValueError):
    """A tool call that cannot be run; the message is shown to the model."""


def find_calls(text: str) -> list[str] | None:
    """The raw bodies of the `<tool_call>` blocks, None when the turn makes no call;
    CallError for an unclosed tag or too many calls."""
    if OPEN not in text:
        return None
    bodies = _CALL.findall(text)
    if text.count(OPEN) != len(bodies):
        raise CallError(f"a {OPEN} has no matching {CLOSE}")
    if len(bodies) > MAX_CALLS_PER_TURN:
        raise CallError(f"at most {MAX_CALLS_PER_TURN} tool calls per turn (got {len(bodies)})")
    return bodies


def parse_call(body: str, tools: Mapping[str, Tool]) -> ToolCall:
    """One call's JSON, checked against the tool's schema; CallError saying what is wrong."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise CallError(f"the tool call is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise CallError('a tool call is a JSON object {"name": ..., "arguments": {...}}')
    name, arguments = data["name"], data.get("arguments", {})
    if name not in tools:
        raise CallError(f"unknown tool {name!r} (tools: {', '.join(sorted(tools))})")
    if not isinstance(arguments, dict):
        raise CallError(f"{name}: arguments must be a JSON object")
    _check_arguments(tools[name], arguments)
    return ToolCall(name=name, arguments=arguments)


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


def _check_arguments(tool: Tool, arguments: Mapping[str, Any]) -> None:
    properties = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in arguments]
    unknown = [k for k in arguments if k not in properties]
    if missing or unknown:
        raise CallError(
            f"{tool.name} takes {', '.join(properties) or 'no arguments'}"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    for key, value in arguments.items():
        want = _JSON_TYPES.get(properties[key].get("type", ""))
        if want is not None and not isinstance(value, want):
            kind = properties[key]["type"]
            raise CallError(f"{tool.name}: argument {key} must be a {kind}")
