"""`tool_calls` driven by a scripted policy on the real SmolLM2 tokenizer (whose template has no
tool format: the fallback syntax), and on a Qwen2.5-style template (the template's format)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from lm.chat_turns import render
from protocol.environments import EnvironmentConfig
from protocol.trajectories import validate_trajectory
from tests.worker.environments import sandbox_tools
from tests.worker.environments.scripted import ScriptedEngine, assert_token_exact, span_text
from worker.environments.sandbox import ToolSandbox
from worker.environments.tool_calls import ToolCallsEnvironment
from worker.environments.tools import BUILTIN_TOOLS, Tool

QUESTION = [{"role": "user", "content": "What is 123456789 * 987654321?"}]
PRODUCT = str(123456789 * 987654321)


def call(expression: str) -> str:
    body = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(body)}\n</tool_call>"


def make_env(
    tokenizer: Any, sandbox: ToolSandbox, tools: dict[str, Tool] | None = None, **fields: Any
) -> ToolCallsEnvironment:
    config = EnvironmentConfig(name="tool_calls", tools=["calculator"], **fields)
    return ToolCallsEnvironment(config, tokenizer, max_model_len=2048, sandbox=sandbox, tools=tools)


def test_tool_call_then_answer(small_tokenizer: Any, sandbox: ToolSandbox) -> None:
    engine = ScriptedEngine(small_tokenizer, [call("123456789 * 987654321"), f"It is {PRODUCT}."])
    env = make_env(small_tokenizer, sandbox)
    assert not env.template_format  # SmolLM2's template has no tool format: the fallback
    t = env.rollout(engine, QUESTION, max_new_tokens=64)
    validate_trajectory(t, 2048)
    assert (t.stop_reason, t.tool_calls, t.tool_errors, t.model_turns) == ("done", 1, 0, 2)
    assert_token_exact(t, engine)
    [env_text] = span_text(small_tokenizer, t, "environment")
    assert env_text == (
        '\n<|im_start|>user\n<tool_response>\n{"name": "calculator", "result": "'
        f'{PRODUCT}"}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
    )
    prompt = small_tokenizer.decode(t.token_ids[: t.prompt_tokens])
    assert "<tool_call>" in prompt and '"name": "calculator"' in prompt  # fallback instructions
    kinds = [(m.role, m.kind) for m in t.messages]
    assert kinds == [
        ("system", "prompt"),
        ("user", "prompt"),
        ("assistant", "model"),
        ("user", "tool_result"),
        ("assistant", "model"),
    ]
    assert t.messages[2].tool_calls[0].arguments == {"expression": "123456789 * 987654321"}
    assert t.completion_text().endswith(f"It is {PRODUCT}.")


def test_appended_turns_equal_a_full_render(small_tokenizer: Any, sandbox: ToolSandbox) -> None:
    """For SmolLM2 (ChatML) the appended segments agree with rendering the whole transcript
    once: the trajectory is the template's conversation, token for token (plus the template's
    trailing newline after the last turn)."""
    engine = ScriptedEngine(small_tokenizer, [call("2**10"), "1024"])
    t = make_env(small_tokenizer, sandbox).rollout(engine, QUESTION, max_new_tokens=64)
    messages = [{"role": m.role, "content": m.content} for m in t.messages]
    whole = render(small_tokenizer, messages, generation_prompt=False)
    ids = small_tokenizer(whole, add_special_tokens=False)["input_ids"]
    assert ids == [*t.token_ids, *small_tokenizer("\n", add_special_tokens=False)["input_ids"]]


def test_model_tokens_kept_as_sampled(small_tokenizer: Any, sandbox: ToolSandbox) -> None:
    """A model turn in a non-canonical tokenization (character by character) stays as sampled:
    a re-render would merge it into other tokens, the trajectory does not."""
    chars = [i for c in "Forty" for i in small_tokenizer(c, add_special_tokens=False)["input_ids"]]
    engine = ScriptedEngine(small_tokenizer, [chars])
    t = make_env(small_tokenizer, sandbox).rollout(engine, QUESTION, max_new_tokens=64)
    [model] = [s for s in t.spans if s.kind == "model"]
    assert t.token_ids[model.start : model.end - 1] == chars
    assert small_tokenizer("Forty", add_special_tokens=False)["input_ids"] != chars
    assert_token_exact(t, engine)


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        ("<tool_call>\n{not json}\n</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "web", "arguments": {}}</tool_call>', "unknown tool 'web'"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}', "no matching"),
        ('<tool_call>{"name": "calculator", "arguments": {"x": 1}}</tool_call>', "missing"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": 5}}</tool_call>', "string"),
        ('<tool_call>["calculator"]</tool_call>', "a tool call is a JSON object"),
        (call("__import__('os').system('id')"), "Call is not allowed"),
        (call("9 ** 9 ** 9"), "too large"),
        (call("1/0"), "division by zero"),
    ],
)
def test_bad_call_is_a_tool_error_message(
    small_tokenizer: Any, sandbox: ToolSandbox, reply: str, needle: str
) -> None:
    engine = ScriptedEngine(small_tokenizer, [reply, "Sorry."])
    t = make_env(small_tokenizer, sandbox).rollout(engine, QUESTION, max_new_tokens=64)
    assert (t.stop_reason, t.tool_calls, t.tool_errors) == ("done", 1, 1)
    [error] = [m for m in t.messages if m.kind == "tool_error"]
    assert needle in json.loads(error.content.split("\n")[1])["error"]
    [env_text] = span_text(small_tokenizer, t, "environment")
    assert needle.split("'")[0] in env_text  # the model reads the reason
    assert_token_exact(t, engine)


def test_max_turns_ends_the_rollout(small_tokenizer: Any, sandbox: ToolSandbox) -> None:
    engine = ScriptedEngine(small_tokenizer, [call("1+1")])  # calls forever
    t = make_env(small_tokenizer, sandbox, max_turns=3).rollout(engine, QUESTION, max_new_tokens=64)
    assert (t.stop_reason, t.model_turns, t.tool_calls) == ("max_turns", 3, 2)
    assert [s.kind for s in t.spans].count("environment") == 2
    assert t.messages[-1].kind == "model" and t.messages[-1].tool_calls  # recorded, not run
    assert_token_exact(t, engine)


def test_token_budget_caps_the_last_turn(small_tokenizer: Any, sandbox: ToolSandbox) -> None:
    """The last generate gets exactly the room left; cut there, the rollout ends token_budget
    with the trajectory at the budget."""
    first = ScriptedEngine(small_tokenizer, [call("1+1"), "x " * 200])
    probe = make_env(small_tokenizer, sandbox).rollout(first, QUESTION, max_new_tokens=64)
    budget = probe.spans[2].end + 10  # room for 10 tokens of the second model turn
    engine = ScriptedEngine(small_tokenizer, [call("1+1"), "x " * 200])
    env = make_env(small_tokenizer, sandbox, max_total_tokens=budget)
    t = env.rollout(engine, QUESTION, max_new_tokens=64)
    assert (t.stop_reason, len(t.token_ids), engine.limits[1]) == ("token_budget", budget, 10)
    validate_trajectory(t, budget)
    assert_token_exact(t, engine)


def test_tool_result_that_does_not_fit(small_tokenizer: Any, sandbox: ToolSandbox) -> None:
    probe = ScriptedEngine(small_tokenizer, [call("1+1"), "2"])
    full = make_env(small_tokenizer, sandbox).rollout(probe, QUESTION, max_new_tokens=64)
    budget = full.spans[1].end + 5  # the tool result needs more than 5 tokens
    engine = ScriptedEngine(small_tokenizer, [call("1+1"), "2"])
    env = make_env(small_tokenizer, sandbox, max_total_tokens=budget)
    t = env.rollout(engine, QUESTION, max_new_tokens=64)
    assert (t.stop_reason, t.model_turns, len(t.token_ids)) == ("token_budget", 1, budget - 5)
    assert [s.kind for s in t.spans] == ["prompt", "model"]


def test_length_cut_turn(small_tokenizer: Any, sandbox: ToolSandbox) -> None:
    engine = ScriptedEngine(small_tokenizer, ["word " * 100])
    t = make_env(small_tokenizer, sandbox).rollout(engine, QUESTION, max_new_tokens=8)
    assert (t.stop_reason, t.model_turns, t.trained_tokens) == ("length", 1, 8)


def test_hanging_tool_is_cut_by_its_timeout(small_tokenizer: Any, sandbox: ToolSandbox) -> None:
    hanging = {
        "calculator": Tool(
            "calculator", "hangs", BUILTIN_TOOLS["calculator"].parameters, sandbox_tools.hang
        )
    }
    env = make_env(small_tokenizer, sandbox, hanging, tool_timeout_s=0.5)
    engine = ScriptedEngine(small_tokenizer, [call("1+1"), "never asked"])
    t = env.rollout(engine, QUESTION, max_new_tokens=64)
    assert (t.stop_reason, t.tool_calls, t.tool_errors, t.model_turns) == ("tool_timeout", 1, 1, 1)
    assert [s.kind for s in t.spans] == ["prompt", "model"]
    ok = make_env(small_tokenizer, sandbox).rollout(
        ScriptedEngine(small_tokenizer, [call("6*7"), "42"]), QUESTION, max_new_tokens=64
    )
    assert ok.stop_reason == "done" and "42" in ok.messages[3].content  # a fresh child


QWEN25_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You "
    "are a helpful assistant.' }}{%- endif %}{{- \"\\n\\n# Tools\\n\\nYou may call one or more "
    "functions to assist with the user query.\\n\\nYou are provided with function signatures "
    'within <tools></tools> XML tags:\\n<tools>" }}{%- for tool in tools %}{{- "\\n" }}'
    '{{- tool | tojson }}{%- endfor %}{{- "\\n</tools>\\n\\nFor each function call, return a '
    "json object with function name and arguments within <tool_call></tool_call> XML tags:\\n"
    '<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n\" }}{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- for message in messages %}"
    '{%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    "(message.role == \"assistant\" and not message.tool_calls) %}{{- '<|im_start|>' + "
    "message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- elif message.role == "
    "\"assistant\" %}{{- '<|im_start|>' + message.role }}{%- if message.content %}{{- '\\n' + "
    "message.content }}{%- endif %}{%- for tool_call in message.tool_calls %}{%- if "
    "tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- elif message.role == \"tool\" %}{%- if (loop.index0 == 0) or "
    "(messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    '{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}'
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_template_tool_format(small_tokenizer: Any, sandbox: ToolSandbox) -> None:
    """A template with a tool format describes the tools itself and renders results its own
    way: two calls of one turn come back as one grouped user turn of <tool_response>s."""
    qwen_like = copy.deepcopy(small_tokenizer)
    qwen_like.chat_template = QWEN25_TEMPLATE
    env = make_env(qwen_like, sandbox)
    assert env.template_format
    engine = ScriptedEngine(qwen_like, [call("6*7") + "\n" + call("2**64"), "42 and 2^64"])
    t = env.rollout(engine, QUESTION, max_new_tokens=128)
    assert (t.stop_reason, t.tool_calls, t.tool_errors) == ("done", 2, 0)
    prompt = qwen_like.decode(t.token_ids[: t.prompt_tokens])
    assert "# Tools" in prompt and '"name": "calculator"' in prompt
    [env_text] = span_text(qwen_like, t, "environment")
    assert env_text == (
        f"\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n"
        f"{2**64}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert [m.role for m in t.messages if m.kind == "tool_result"] == ["tool", "tool"]
    assert_token_exact(t, engine)
