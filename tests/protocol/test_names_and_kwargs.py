"""Reward and environment names are bounded and matched whole (no trailing newline), and every
built-in reward's kwargs are checked against the types its signature declares
(protocol/rewards.py `KWARG_MODELS`), the error naming the kwarg."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from protocol import environments, layout, rewards
from protocol.rewards_judge import check_api_key_env
from protocol.run_config import RewardSpec
from tests.protocol.test_run_config import base, errors_of

JUDGE = {"base_url": "https://judge.example.com/v1", "model": "m"}
# Required kwargs of a built-in, so that one other kwarg can be tested alone.
REQUIRED = {"llm_judge": JUDGE}
# A value of no declared type of any built-in kwarg (str, int, float, bool, a sequence, None).
NO_TYPE = {"not": "a declared type"}


def _with_reward(name: str, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = base()
    cfg["rewards"] = [{"name": name, "kwargs": kwargs or {}}]
    return cfg


def _with_environment(name: str) -> dict[str, Any]:
    cfg = base()
    cfg["environment"] = {"name": name}
    return cfg


def _declared(name: str) -> list[str]:
    """The built-in's keyword parameters, read off its function's signature."""
    params = inspect.signature(rewards.BUILTINS[name]).parameters.values()
    return [
        p.name
        for p in params
        if p.name not in ("prompts", "completions") and p.kind is not p.VAR_KEYWORD
    ]


@pytest.mark.parametrize("value", ["x", [1], 1.5, True, "200", None, NO_TYPE])
def test_length_limit_max_chars_of_another_type_is_refused_naming_the_kwarg(value: Any) -> None:
    errors = errors_of(_with_reward("length_limit", {"max_chars": value}))
    assert [(path, kind) for path, _msg, kind in errors] == [
        ("rewards.0.kwargs.max_chars", "reward_kwarg_invalid")
    ]
    assert "length_limit: kwargs.max_chars" in errors[0][1]


def test_length_limit_below_one_is_refused_and_a_good_limit_passes() -> None:
    [(path, message, _)] = errors_of(_with_reward("length_limit", {"max_chars": 0}))
    assert path == "rewards.0.kwargs.max_chars" and "greater than or equal to 1" in message
    assert RewardSpec(name="length_limit", kwargs={"max_chars": 7}).kwargs == {"max_chars": 7}


@pytest.mark.parametrize(
    ("name", "kwarg"),
    [(name, kwarg) for name in sorted(rewards.BUILTINS) for kwarg in _declared(name)],
)
def test_every_declared_kwarg_of_every_builtin_is_type_checked(name: str, kwarg: str) -> None:
    errors = errors_of(_with_reward(name, {**REQUIRED.get(name, {}), kwarg: NO_TYPE}))
    assert len(errors) == 1, errors
    path, message, _kind = errors[0]
    assert path.startswith("rewards.0.kwargs"), errors
    assert kwarg in path or kwarg in message, errors


def test_every_builtin_has_a_kwargs_model_of_its_declared_parameters() -> None:
    assert set(rewards.KWARG_MODELS) == set(rewards.BUILTINS)
    for name in rewards.BUILTINS:
        assert list(rewards.KWARG_MODELS[name].model_fields) == _declared(name)


def test_good_kwargs_of_every_type_still_pass() -> None:
    RewardSpec(name="hash_score", kwargs={"salt": "s"})
    RewardSpec(name="think_format", kwargs={"think_in_prompt": True})
    RewardSpec(name="math_verify", kwargs={"column": "solution"})
    RewardSpec(name="llm_judge", kwargs={**JUDGE, "max_score": 5, "temperature": 0.5})
    with pytest.raises(rewards.RewardError, match="hash_score: kwargs.salt"):
        rewards.check_kwargs("hash_score", {"salt": 1})


@pytest.mark.parametrize("kind", ["reward", "environment"])
@pytest.mark.parametrize(
    "name", ["a" * 201, "pkg.mod:" + "f" * 193, "verifiers:" + "m" * 191, "x" * 10_002]
)
def test_names_over_200_characters_are_refused_without_echoing_them(kind: str, name: str) -> None:
    cfg = _with_reward(name) if kind == "reward" else _with_environment(name)
    [(path, message, code)] = errors_of(cfg)
    assert path == ("rewards.0.name" if kind == "reward" else "environment.name")
    assert code == "name_too_long"
    assert f"{len(name):,} characters" in message and name not in message


def test_names_of_200_characters_pass() -> None:
    for name in ("a" * 200, "pkg.mod:" + "f" * 192):
        rewards.check_name(name)
        environments.check_name(name)
    environments.check_name("verifiers:" + "m" * 190)


@pytest.mark.parametrize(
    "name", ["mymod:score\n", "my_entry_point\n", "pkg.mod:fn\n", "verifiers:mod\n", "a:b\n\n"]
)
def test_a_trailing_newline_is_not_part_of_a_name(name: str) -> None:
    with pytest.raises(rewards.RewardError):
        rewards.check_name(name)
    with pytest.raises(environments.EnvironmentNameError):
        environments.check_name(name)
    assert not rewards.MODULE_PATH.match(name.partition(":")[0] + "\n")
    assert environments.verifiers_module(name) is None
    assert not environments.declared_allows(["mymod:*", "pkg.mod:*", "verifiers:*"], name)
    [(path, _msg, _code)] = errors_of(_with_reward(name))
    assert path == "rewards.0.name"


def test_other_whole_name_patterns_refuse_a_trailing_newline() -> None:
    with pytest.raises(ValueError, match="not a tool name"):
        environments.EnvironmentConfig(name="tool_calls", tools=["calculator\n"])
    with pytest.raises(ValueError):
        layout.adapter_key("00000000-0000-0000-0000-000000000000", 1, "adapter.bin\n")
    key = layout.batch_key(
        "00000000-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000001", 3
    )
    assert layout.parse_batch_key(key)[2] == 3
    for bad in (key + "\n", key.replace("-3.parquet", "-\u0663.parquet")):
        with pytest.raises(ValueError, match="not a batch key"):
            layout.parse_batch_key(bad)
    with pytest.raises(Exception, match="api_key_env"):
        check_api_key_env("JUDGE_KEY\n")
