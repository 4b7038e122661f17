"""Tokens of a multi-turn conversation, appended turn by turn (never re-rendered afterwards).

A trajectory's tokens are: the prompt, rendered once by the chat template with the generation
prompt (exactly as lm/chat.py's `encode_prompt`); then each model turn as the engine sampled
it (EOS included); then each environment turn (tool results, game answers) as a text segment
tokenized on its own with `add_special_tokens=False` and appended. Re-rendering the whole
conversation after the fact is the classic source of train/inference mismatch (a template that
strips reasoning from past turns, whitespace the model did not produce, a different split of
the model's text into tokens); here the model's tokens are never rendered at all.

How an environment segment's text is found (`environment_segment`), from the template alone:
1. r0 = render(history + [assistant: PLACEHOLDER]), no generation prompt;
2. r1 = render(history + [assistant: PLACEHOLDER] + new messages), with the generation prompt;
3. r1 must start with r0 (else `TemplateMismatch`: the template renders earlier messages
   differently once later ones exist, and no appended segment can be exact);
4. the closing text the template writes after the assistant's content (r0 after the
   placeholder, e.g. `<|im_end|>\n`) opens the segment, less the text of the EOS token the
   model ended its turn with when the closing starts with it (`<|im_end|>`: already in the
   trajectory, so only `\n` is appended). A model that stopped on another of its EOS tokens
   (e.g. `<|endoftext|>` where the template closes with `<|im_end|>`) gets the whole closing
   appended after it: the engine then sees a closed turn, as the template would write it;
5. the segment is that rest + r1[len(r0):] (the new messages and the next assistant header).
The placeholder stands in for the model's content, so the model's text never goes through the
template. The function is deterministic: a learner re-derives every segment from the
transcript and compares the tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from protocol.trajectories import TranscriptMessage

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PLACEHOLDER = "ASYNCGRPO_MODEL_TURN_7f3a"
TOOL_CALL_OPEN = "<tool_call>"
Message = Mapping[str, Any]


class TemplateMismatch(ValueError):
    """The chat template cannot be extended turn by turn exactly (see the module docstring)."""


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    *,
    generation_prompt: bool,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    extra: dict[str, Any] = {"tools": list(tools)} if tools else {}
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tokenize=False,
        add_generation_prompt=generation_prompt,
        **extra,
    )
    return str(text)


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """The prompt's tokens, ending with the assistant header (as lm.chat.encode_prompt)."""
    return encode_text(tokenizer, render(tokenizer, messages, generation_prompt=True, tools=tools))


def environment_segment(
    tokenizer: PreTrainedTokenizerBase,
    history: Sequence[Message],
    new_messages: Sequence[Message],
    model_ending: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The text to append after a model turn: the template's closing of that turn (less what
    the model already produced, `model_ending`: the text of its EOS token), the new messages and
    the next assistant header. `history` holds the messages before the model's turn."""
    turn = [*history, {"role": "assistant", "content": PLACEHOLDER}]
    r0 = render(tokenizer, turn, generation_prompt=False, tools=tools)
    r1 = render(tokenizer, [*turn, *new_messages], generation_prompt=True, tools=tools)
    if not r1.startswith(r0):
        raise TemplateMismatch(
            "the chat template renders a conversation differently once messages are added "
            "after it; its turns cannot be appended token-exactly"
        )
    at = r0.rfind(PLACEHOLDER)
    if at < 0:
        raise TemplateMismatch("the chat template drops the assistant message's content")
    closing = r0[at + len(PLACEHOLDER) :]
    if model_ending and closing.startswith(model_ending):
        closing = closing[len(model_ending) :]
    return closing + r1[len(r0) :]


def template_has_tool_format(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template takes `tools` and shows `<tool_call>` (Qwen2.5/Hermes); else
    the fallback syntax (worker/environments/tools.py) is used."""
    template = tokenizer.chat_template
    return isinstance(template, str) and "tools" in template and TOOL_CALL_OPEN in template


def function_schema(name: str, description: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI-style function schema chat templates take as `tools`."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": dict(parameters)},
    }


def tool_message(
    name: str | None,
    *,
    result: str | None = None,
    error: str | None = None,
    template_format: bool,
) -> TranscriptMessage:
    """The transcript message of one tool call's outcome: a `tool` message for a template with
    a tool format, else the fallback's `user` message with a `<tool_response>` block. Shared by
    the worker (which writes it) and the learner (which re-derives it)."""
    kind = "tool_error" if error is not None else "tool_result"
    if template_format:
        content = f"error: {error}" if error is not None else str(result)
        return TranscriptMessage(role="tool", content=content, kind=kind, name=name)
    body: dict[str, Any] = {"name": name}
    body.update({"error": error} if error is not None else {"result": result})
    content = f"<tool_response>\n{json.dumps(body)}\n</tool_response>"
    return TranscriptMessage(role="user", content=content, kind=kind, name=name)
