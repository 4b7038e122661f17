"""The reward registry on real completion strings."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from protocol import rewards
from protocol.rewards import RewardError, combine, resolve


def spec(name: str, weight: float = 1.0, **kwargs: object) -> SimpleNamespace:
    return SimpleNamespace(name=name, weight=weight, kwargs=kwargs)


def test_numeric_match_takes_the_last_number() -> None:
    completions = [
        "45 + 98 = 143",
        "The answer is 143.",
        "143",
        "I think 142, no wait, 143",
        "It is 143 or maybe 144",
        "one hundred forty-three",
        "",
        "-7",
        "1,234",
        "12.0",
    ]
    answers = ["143"] * 7 + ["-7", "1234", "12"]
    got = rewards.numeric_match(["q"] * len(completions), completions, answer=answers)
    assert got == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]


def test_numeric_match_needs_the_answer_column() -> None:
    with pytest.raises(RewardError, match="needs an `answer` reference column"):
        rewards.numeric_match(["q"], ["1"])


def test_numeric_match_accepts_trl_conversational_completions() -> None:
    completions = [[{"role": "assistant", "content": "So 12."}]]
    assert rewards.numeric_match(["q"], completions, answer=["12"]) == [1.0]


def test_answer_format() -> None:
    completions = [
        "<answer>12</answer>",
        "think... <answer>\n12\n</answer> done",
        "<answer>12",
        "answer: 12",
        "</answer>12<answer>",
    ]
    assert rewards.answer_format(["q"] * 5, completions) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_length_limit_scores_by_length() -> None:
    completions = ["x" * 10, "x" * 20, "x" * 30, "x" * 40, "x" * 100]
    got = rewards.length_limit(["q"] * 5, completions, max_chars=20)
    assert got == [1.0, 1.0, 0.5, 0.0, 0.0]


def test_hash_score_is_a_fixed_function_of_salt_and_text() -> None:
    texts = [f"completion {i}" for i in range(64)]
    scores = rewards.hash_score(["q"] * 64, texts)
    assert all(0.0 <= s < 1.0 for s in scores)  # type: ignore[operator]
    assert len(set(scores)) == 64  # distinct texts score apart: a group is never all-equal
    assert rewards.hash_score(["other prompt"] * 64, texts) == scores  # the prompt plays no part
    assert rewards.hash_score(["q"], [[{"role": "assistant", "content": "completion 3"}]]) == [
        scores[3]
    ]
    salted = rewards.hash_score(["q"] * 64, texts, salt="run-2")
    assert sum(a != b for a, b in zip(salted, scores, strict=True)) == 64
    # spread over [0, 1): a quarter of the scores in each quarter, give or take
    quarters = [sum(q / 4 <= s < (q + 1) / 4 for s in scores) for q in range(4)]  # type: ignore[operator]
    assert min(quarters) >= 6


def test_resolve_builtins_and_unknown_names() -> None:
    assert resolve("numeric_match") is rewards.numeric_match
    with pytest.raises(RewardError, match="unknown reward 'nope'"):
        resolve("nope")
    with pytest.raises(RewardError, match="cannot import reward module"):
        resolve("no_such_module_for_asyncgrpo:f")
    with pytest.raises(RewardError, match="has no callable 'nothing_here'"):
        resolve("protocol.rewards:nothing_here")


def test_resolve_imports_user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_user_rewards.py").write_text(
        textwrap.dedent("""
        def shout(prompts, completions, **columns):
            return [1.0 if c.isupper() else 0.0 for c in completions]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        fn = resolve("my_user_rewards:shout")
        assert fn(["q", "q"], ["HELLO", "hello"]) == [1.0, 0.0]
    finally:
        sys.modules.pop("my_user_rewards", None)


def test_combine_weights_rewards_and_reports_each() -> None:
    prompts = ["What is 2 + 3?"] * 4
    completions = ["<answer>5</answer>", "5", "<answer>6</answer>", "x" * 50 + " 5"]
    columns = {"answer": ["5"] * 4}
    result = combine(
        [
            spec("numeric_match", 1.0),
            spec("answer_format", 0.5),
            spec("length_limit", 2.0, max_chars=40),
        ],
        prompts,
        completions,
        columns,
    )
    assert result.per_reward["numeric_match"] == [1.0, 1.0, 0.0, 1.0]
    assert result.per_reward["answer_format"] == [1.0, 0.0, 1.0, 0.0]
    length = result.per_reward["length_limit"]
    assert length[:3] == [1.0, 1.0, 1.0] and 0.0 < length[3] < 1.0
    for i in range(4):
        expected = (
            result.per_reward["numeric_match"][i]
            + 0.5 * result.per_reward["answer_format"][i]
            + 2.0 * length[i]
        )
        assert result.total[i] == pytest.approx(expected)


def test_combine_repeated_names_get_suffixes_and_none_is_skipped() -> None:
    def sometimes(prompts, completions, **_):  # type: ignore[no-untyped-def]
        return [None, 2.0]

    rewards.BUILTINS["_test_sometimes"] = sometimes
    try:
        result = combine(
            [spec("_test_sometimes", 3.0), spec("_test_sometimes", 1.0)], ["a", "b"], ["x", "y"], {}
        )
    finally:
        del rewards.BUILTINS["_test_sometimes"]
    assert set(result.per_reward) == {"_test_sometimes", "_test_sometimes#2"}
    assert math.isnan(result.per_reward["_test_sometimes"][0])
    assert result.total == [0.0, 8.0]


def test_combine_refuses_bad_outputs_and_misaligned_columns() -> None:
    def short(prompts, completions, **_):  # type: ignore[no-untyped-def]
        return [1.0]

    rewards.BUILTINS["_test_short"] = short
    try:
        with pytest.raises(RewardError, match="must return a list of 2 floats"):
            combine([spec("_test_short")], ["a", "b"], ["x", "y"], {})
    finally:
        del rewards.BUILTINS["_test_short"]
    with pytest.raises(RewardError, match="one entry per completion"):
        combine([spec("numeric_match")], ["a", "b"], ["1", "2"], {"answer": ["1"]})


def test_check_name_and_kwargs() -> None:
    rewards.check_name("pkg.sub_mod:fn_2")
    for bad in ("pkg.:fn", "pkg:fn:x", ":fn", "pkg mod:fn", "1pkg:fn"):
        with pytest.raises(RewardError):
            rewards.check_name(bad)
    rewards.check_kwargs("length_limit", {"max_chars": 10})
    rewards.check_kwargs("pkg:fn", {"anything": 1})
    with pytest.raises(RewardError, match="answer_format takes no argument limit"):
        rewards.check_kwargs("answer_format", {"limit": 1})
