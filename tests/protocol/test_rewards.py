"""The reward registry on real completion strings."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from protocol import rewards
from protocol.rewards import RewardAllowlist, RewardError, combine, not_loadable, resolve


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
    with pytest.raises(RewardError, match="'nope' is not an entry point"):
        resolve("nope")
    with pytest.raises(RewardError, match="unknown reward 'nope me'"):
        resolve("nope me")
    allowed = RewardAllowlist(
        modules=frozenset({"no_such_module_for_asyncgrpo", "protocol.rewards"})
    )
    with pytest.raises(RewardError, match="cannot import reward module"):
        resolve("no_such_module_for_asyncgrpo:f", allowed)
    with pytest.raises(RewardError, match="has no callable 'nothing_here'"):
        resolve("protocol.rewards:nothing_here", allowed)


def test_resolve_imports_user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_user_rewards.py").write_text(
        textwrap.dedent("""
        def shout(prompts, completions, **columns):
            return [1.0 if c.isupper() else 0.0 for c in completions]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        fn = resolve(
            "my_user_rewards:shout", RewardAllowlist(modules=frozenset({"my_user_rewards"}))
        )
        assert fn(["q", "q"], ["HELLO", "hello"]) == [1.0, 0.0]
    finally:
        sys.modules.pop("my_user_rewards", None)


def _importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A module `name` on sys.path that records being imported."""
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent("""
        import sys
        sys.modules["builtins"].__dict__.setdefault("_asyncgrpo_imported", []).append(__name__)

        def score(prompts, completions, **columns):
            return [0.25] * len(completions)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_module_outside_the_allowlist_is_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _importable(tmp_path, monkeypatch, "asyncgrpo_unlisted_rewards")
    other = RewardAllowlist(modules=frozenset({"asyncgrpo_other_rewards"}))
    for allowed in (RewardAllowlist(), other):
        with pytest.raises(RewardError, match="'asyncgrpo_unlisted_rewards' is not allowed"):
            resolve("asyncgrpo_unlisted_rewards:score", allowed)
    assert "asyncgrpo_unlisted_rewards" not in sys.modules
    import builtins

    assert "asyncgrpo_unlisted_rewards" not in getattr(builtins, "_asyncgrpo_imported", [])


def test_standard_library_rewards_are_refused_even_when_listed() -> None:
    allowed = RewardAllowlist(modules=frozenset({"os", "os.path", "subprocess", "builtins"}))
    for name in ("os:system", "os.path:join", "subprocess:run", "builtins:eval"):
        with pytest.raises(RewardError, match="standard library"):
            rewards.check_name(name)
        with pytest.raises(RewardError, match="standard library"):
            resolve(name, allowed)


def test_an_installed_entry_point_loads_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny installed distribution (a dist-info folder on sys.path) declares the entry point
    `graded = asyncgrpo_ep_rewards:score` in the group asyncgrpo.rewards."""
    _importable(tmp_path, monkeypatch, "asyncgrpo_ep_rewards")
    dist = tmp_path / "asyncgrpo_ep_rewards-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: asyncgrpo-ep-rewards\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[asyncgrpo.rewards]\ngraded = asyncgrpo_ep_rewards:score\n"
    )
    try:
        with pytest.raises(RewardError, match="'graded' is not an entry point"):
            resolve("graded")
        allowed = RewardAllowlist.discover()
        assert allowed.entry_points["graded"] == "asyncgrpo_ep_rewards:score"
        assert "graded" in allowed.names()
        assert resolve("graded", allowed)(["q"], ["c"]) == [0.25]
        # the entry point allows itself, not its module's other names
        with pytest.raises(RewardError, match="is not allowed"):
            resolve("asyncgrpo_ep_rewards:score", allowed)
    finally:
        sys.modules.pop("asyncgrpo_ep_rewards", None)


def test_reported_names_and_what_a_learner_cannot_load() -> None:
    allowed = RewardAllowlist(
        modules=frozenset({"pkg.mod"}), entry_points={"graded": "pkg.other:score"}
    )
    names = allowed.names()
    assert set(rewards.BUILTINS) <= set(names) and "graded" in names and "pkg.mod:*" in names
    run = ["numeric_match", "graded", "pkg.mod:f", "pkg.mod.sub:f", "pkg:f", "other", "other"]
    assert not_loadable(run, names) == ["pkg.mod.sub:f", "pkg:f", "other"]
    assert not_loadable(run, RewardAllowlist().names()) == [
        "graded",
        "pkg.mod:f",
        "pkg.mod.sub:f",
        "pkg:f",
        "other",
    ]


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
    rewards.check_name("my_entry-point.v2")  # an entry-point name
    for bad in ("pkg.:fn", "pkg:fn:x", ":fn", "pkg mod:fn", "1pkg:fn", "a b", ""):
        with pytest.raises(RewardError):
            rewards.check_name(bad)
    with pytest.raises(RewardError, match="did you mean 'numeric_match'"):
        rewards.check_name("numeric_macth")
    rewards.check_kwargs("length_limit", {"max_chars": 10})
    rewards.check_kwargs("pkg:fn", {"anything": 1})
    with pytest.raises(RewardError, match="answer_format takes no argument limit"):
        rewards.check_kwargs("answer_format", {"limit": 1})
