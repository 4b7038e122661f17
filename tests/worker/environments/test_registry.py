"""Which environments a worker loads: built-ins, and user code only from its allowlist."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from lm.chat_turns import TemplateMismatch, environment_segment
from protocol.environments import EnvironmentAllowlist, EnvironmentConfig
from tests.worker.environments.scripted import ScriptedEngine, assert_token_exact
from worker.environments.base import EnvironmentSetupError, PromptTooLong
from worker.environments.registry import make_environment, resolve
from worker.environments.single_turn import SingleTurnEnvironment

MODULE = "tests.worker.environments.user_env"


def test_builtins_resolve() -> None:
    assert resolve("single_turn") is SingleTurnEnvironment


def test_user_module_not_allowed_is_not_imported() -> None:
    sys.modules.pop(MODULE, None)
    with pytest.raises(EnvironmentSetupError, match="not allowed on this worker"):
        resolve(f"{MODULE}:EchoTwice")
    assert MODULE not in sys.modules
    with pytest.raises(EnvironmentSetupError, match="standard library"):
        resolve("os:system", EnvironmentAllowlist(frozenset({"os"})))


def test_allowed_module_and_entry_point_run(small_tokenizer: Any) -> None:
    by_module = EnvironmentAllowlist(frozenset({MODULE}))
    by_entry = EnvironmentAllowlist(entry_points={"echo": f"{MODULE}:EchoTwice"})
    for name, allowed in ((f"{MODULE}:EchoTwice", by_module), ("echo", by_entry)):
        env = make_environment(
            EnvironmentConfig(name=name), small_tokenizer, max_model_len=1024, allowed=allowed
        )
        engine = ScriptedEngine(small_tokenizer, ["hi", "hi again"])
        t = env.rollout(engine, [{"role": "user", "content": "Say hi."}], max_new_tokens=8)
        assert [s.kind for s in t.spans] == ["prompt", "model", "environment", "model"]
        assert_token_exact(t, engine)
    with pytest.raises(EnvironmentSetupError, match="not an Environment subclass"):
        resolve(f"{MODULE}:NOT_AN_ENVIRONMENT", by_module)


def test_limits_checked_against_the_engine(small_tokenizer: Any) -> None:
    config = EnvironmentConfig(name="guess_number", max_total_tokens=4096)
    with pytest.raises(EnvironmentSetupError, match="exceeds this engine's max_model_len 1024"):
        make_environment(config, small_tokenizer, max_model_len=1024)
    tiny = make_environment(
        EnvironmentConfig(name="guess_number", max_total_tokens=8),
        small_tokenizer,
        max_model_len=64,
    )
    with pytest.raises(PromptTooLong, match="no room for a model turn"):
        tiny.rollout(
            ScriptedEngine(small_tokenizer, ["x"]),
            [{"role": "user", "content": "hi"}],
            max_new_tokens=4,
        )


def test_segments_and_a_template_that_cannot_be_appended(small_tokenizer: Any) -> None:
    """A template that renders earlier turns differently once more exist is refused, not
    silently re-rendered; the closing after the model's EOS is appended."""
    import copy

    counting = copy.deepcopy(small_tokenizer)
    counting.chat_template = (
        "{{ messages | length }}{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    history = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateMismatch, match="renders a conversation differently"):
        environment_segment(counting, history, [{"role": "user", "content": "x"}], "<|im_end|>")
    new = [{"role": "user", "content": "x"}]
    tail = "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    assert environment_segment(small_tokenizer, history, new, "<|im_end|>") == "\n" + tail
    # a turn that stopped on another EOS token gets the template's whole closing
    assert environment_segment(small_tokenizer, history, new, "</s>") == "<|im_end|>\n" + tail
