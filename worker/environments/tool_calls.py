"""`tool_calls`: the model may call tools (worker/environments/tools.py says how) until it answers.

Each model turn: no `<tool_call>` → the answer (`done`); otherwise, if it was the last allowed
turn → `max_turns` (the calls are recorded on the model message, not run); else every call of
the turn is parsed and run in the sandbox, and one message per call is appended as the next
environment turn (`tool_result`, or `tool_error` for a malformed or failed call: the model
reads what was wrong and may retry; each counts in `tool_errors`). A call that outlives
`tool_timeout_s` is killed and ends the trajectory (`tool_timeout`): a hung tool would hang
every retry alike, and its turn has no result to append. An environment turn that would leave
no room for another model turn within `max_total_tokens` ends it (`token_budget`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lm.chat_turns import template_has_tool_format, tool_message
from protocol.trajectories import StopReason, ToolCall, Trajectory, TranscriptMessage
from worker.environments.base import (
    Conversation,
    Environment,
    EnvironmentSetupError,
    TurnEngine,
    cut_reason,
)
from worker.environments.tools import (
    BUILTIN_TOOLS,
    CallError,
    Tool,
    fallback_instructions,
    find_calls,
    parse_call,
    with_instructions,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from protocol.environments import EnvironmentConfig
    from worker.environments.sandbox import ToolSandbox


class ToolCallsEnvironment(Environment):
    name = "tool_calls"

    def __init__(
        self,
        config: EnvironmentConfig,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_model_len: int,
        sandbox: ToolSandbox | None = None,
        tools: Mapping[str, Tool] | None = None,
    ) -> None:
        super().__init__(config, tokenizer, max_model_len=max_model_len, sandbox=sandbox)
        registry = BUILTIN_TOOLS if tools is None else tools
        missing = [t for t in config.tools if t not in registry]
        if missing:
            raise EnvironmentSetupError(f"no tool named {', '.join(missing)} on this worker")
        if sandbox is None:
            raise EnvironmentSetupError("tool_calls needs a tool sandbox")
        self.sandbox: ToolSandbox = sandbox
        self.tools = {name: registry[name] for name in config.tools}
        self.template_format = template_has_tool_format(tokenizer)

    def rollout(
        self,
        engine: TurnEngine,
        prompt_messages: Sequence[Mapping[str, Any]],
        *,
        max_new_tokens: int,
        seed: int = 0,
    ) -> Trajectory:
        tools = list(self.tools.values())
        if self.template_format:
            chat = self.start(prompt_messages, tools=[t.schema() for t in tools])
        else:
            chat = self.start(with_instructions(prompt_messages, fallback_instructions(tools)))
        counts = {"calls": 0, "errors": 0}
        stop = self._loop(chat, engine, max_new_tokens, counts)
        return chat.finish(stop, tool_calls=counts["calls"], tool_errors=counts["errors"])

    def _loop(
        self, chat: Conversation, engine: TurnEngine, max_new: int, counts: dict[str, int]
    ) -> StopReason:
        for turn_index in range(self.max_turns):
            turn = chat.model_turn(engine, max_new)
            if turn.finish_reason == "length":
                chat.record_model_message(turn.content)
                return cut_reason(turn)
            problem: str | None = None
            bodies: list[str] | None
            try:
                bodies = find_calls(turn.content)
            except CallError as exc:
                bodies, problem = [], str(exc)
            else:
                if bodies is None:
                    chat.record_model_message(turn.content)
                    return "done"
            calls, replies = self._parse(bodies, problem)
            chat.record_model_message(turn.content, [c for c in calls if c is not None])
            if turn_index == self.max_turns - 1:
                return "max_turns"
            counts["calls"] += len(replies)
            messages, timed_out = self._run(calls, replies, counts)
            if timed_out:
                return "tool_timeout"
            if not chat.append_environment(messages):
                return "token_budget"
        raise AssertionError("unreachable: the last turn returns")

    def _parse(
        self, bodies: list[str], problem: str | None
    ) -> tuple[list[ToolCall | None], list[str | None]]:
        """Per call: the parsed call (None if malformed) and the error text (None if fine)."""
        if problem is not None:
            return [None], [problem]
        calls: list[ToolCall | None] = []
        errors: list[str | None] = []
        for body in bodies:
            try:
                calls.append(parse_call(body, self.tools))
                errors.append(None)
            except CallError as exc:
                calls.append(None)
                errors.append(str(exc))
        return calls, errors

    def _run(
        self, calls: list[ToolCall | None], errors: list[str | None], counts: dict[str, int]
    ) -> tuple[list[TranscriptMessage], bool]:
        messages: list[TranscriptMessage] = []
        for call, error in zip(calls, errors, strict=True):
            name = call.name if call is not None else None
            result: str | None = None
            if call is not None:
                tool = self.tools[call.name]
                outcome = self.sandbox.call(tool.fn, call.arguments, self.config.tool_timeout_s)
                if outcome.timed_out:
                    counts["errors"] += 1
                    return messages, True
                error = outcome.error
                result = outcome.result
            if error is not None:
                counts["errors"] += 1
                messages.append(self._message(name, error=error))
            else:
                messages.append(self._message(name, result=result))
        return messages, False

    def _message(
        self, name: str | None, *, result: str | None = None, error: str | None = None
    ) -> TranscriptMessage:
        return tool_message(name, result=result, error=error, template_format=self.template_format)
