"""The built-ins `math_verify` (with the real math-verify library) and `think_format`, on
tables of real completions, and their kwargs at run creation."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import ValidationError

from protocol import rewards
from protocol.rewards import RewardError
from protocol.rewards_math import extract_answer, last_boxed, reference_text
from protocol.run_config import RewardSpec

# completion, reference, expected score
MATH_TABLE: list[tuple[Any, Any, float | None]] = [
    ("So the probability is \\boxed{1/2}.", "0.5", 1.0),
    ("So the probability is \\boxed{1/2}.", "\\frac{1}{2}", 1.0),
    ("Half: \\boxed{\\frac{1}{2}}", "1/2", 1.0),
    ("Half: \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("0.5", "$\\frac{1}{2}$", 1.0),
    ("She has 12 + 60 = 72 apples.", "Natalia sold 48/2 = 24 … 48+24 = 72\n#### 72", 1.0),
    ("The answer is \\boxed{72}", "#### 72", 1.0),
    ("The answer is 72.0", "72", 1.0),
    ("The answer is \\boxed{71}", "#### 72", 0.0),
    ("I first thought 72, but it is 73", "72", 0.0),  # the last number counts
    ("\\boxed{72} is wrong, \\boxed{73} is right", "73", 1.0),  # the last box counts
    ("I cannot solve this.", "72", 0.0),  # no answer
    ("", "72", 0.0),
    ("\\boxed{}", "72", 0.0),
    ("The total is 1,234 dollars.", "1234", 1.0),  # thousands separators
    ("The total is \\boxed{1,234}", "#### 1,234", 1.0),
    ("It costs 1234 dollars", "1,234", 1.0),
    ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),  # symbolic
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
    ("x = -3", "-3", 1.0),
    ([{"role": "assistant", "content": "So it is \\boxed{72}."}], "72", 1.0),  # chat format
    ([{"role": "assistant", "content": "So it is \\boxed{70}."}], "72", 0.0),
    ("\\boxed{5}", "not a number at all", None),  # unparsable reference: skipped
    ("\\boxed{5}", None, None),
    ("\\boxed{5}", "", None),
    ("5 apples", "She has 5 apples", 1.0),  # a sentence: math-verify's own search finds 5
    ("\\boxed{A}", "A", 1.0),  # a bare answer is read whole
    ("\\boxed{5}", 5, 1.0),  # a reference that is a number, not text
]


def test_math_verify_on_a_table_of_answers() -> None:
    completions = [c for c, _, _ in MATH_TABLE]
    references = [r for _, r, _ in MATH_TABLE]
    got = rewards.math_verify(["q"] * len(completions), completions, answer=references)
    wrong = [(c, r, g, w) for (c, r, w), g in zip(MATH_TABLE, got, strict=True) if g != w]
    assert not wrong, wrong


def test_math_verify_reads_the_column_its_kwarg_names() -> None:
    got = rewards.math_verify(
        ["q", "q"], ["\\boxed{3}", "3"], column="solution", solution=["3", "4"]
    )
    assert got == [1.0, 0.0]
    with pytest.raises(RewardError, match="needs the reference column 'solution'.*has: answer"):
        rewards.math_verify(["q"], ["3"], column="solution", answer=["3"])


def test_math_verify_works_off_the_main_thread() -> None:
    """math-verify's SIGALRM guards only work in the main thread: off it they are turned off."""
    out: list[Any] = []
    thread = threading.Thread(
        target=lambda: out.append(
            rewards.math_verify(["q", "q"], ["\\boxed{1/2}", "\\boxed{2}"], answer=["0.5"] * 2)
        )
    )
    thread.start()
    thread.join(60)
    assert out == [[1.0, 0.0]]


def test_the_extraction_helpers() -> None:
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed {x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed{unclosed") is None
    assert extract_answer("no box, numbers 3 and 4,500") == "4500"
    assert extract_answer("nothing") is None
    assert reference_text("work… #### 1,000") == "1000"


THINK_TABLE = [
    ("<think>2+2 is 4</think>The answer is 4.", 1.0),
    ("  \n<think>\nreason\n</think>\n\n4", 1.0),
    ("<think>reason</think>", 0.0),  # no answer
    ("<think>reason</think>   \n", 0.0),  # blank answer
    ("<think>  </think>4", 0.0),  # blank thought
    ("The answer is 4", 0.0),  # no think block
    ("4 <think>reason</think> 4", 0.0),  # text before the block
    ("<think>a</think><think>b</think>4", 0.0),  # two blocks
    ("<think>a</think>4</think>", 0.0),  # a stray closing tag
    ("<think>a <think> b</think>4", 0.0),  # nested opening tag
    ("reason</think>4", 0.0),  # the opening tag in the prompt does not count
    ([{"role": "assistant", "content": "<think>r</think>4"}], 1.0),
]


def test_think_format_on_a_table() -> None:
    completions = [c for c, _ in THINK_TABLE]
    got = rewards.think_format(["q"] * len(completions), completions)
    assert got == [s for _, s in THINK_TABLE]


# the chat template ended the prompt with <think>: the completion starts inside the thought
THINK_IN_PROMPT_TABLE = [
    ("2+2 is 4</think>The answer is 4.", 1.0),
    ("\nreason\n</think>\n4", 1.0),
    ("reason</think>  ", 0.0),  # no answer
    (" </think>4", 0.0),  # blank thought
    ("<think>reason</think>4", 0.0),  # a second opening tag
    ("reason</think>4</think>", 0.0),
    ("The answer is 4", 0.0),  # never closed
]


def test_think_format_with_the_think_tag_in_the_prompt() -> None:
    completions = [c for c, _ in THINK_IN_PROMPT_TABLE]
    got = rewards.think_format(["q"] * len(completions), completions, think_in_prompt=True)
    assert got == [s for _, s in THINK_IN_PROMPT_TABLE]


def test_run_creation_validates_the_new_builtins_kwargs() -> None:
    assert RewardSpec(name="math_verify", kwargs={"column": "answer"}).kwargs == {
        "column": "answer"
    }
    RewardSpec(name="think_format")
    with pytest.raises(
        ValidationError, match=r"math_verify takes no argument col \(it takes: column\)"
    ):
        RewardSpec(name="math_verify", kwargs={"col": "answer"})
    with pytest.raises(ValidationError, match="column must be the name of a reference column"):
        RewardSpec(name="math_verify", kwargs={"column": ""})
    with pytest.raises(
        ValidationError, match=r"think_format takes no argument x \(it takes: think_in_prompt\)"
    ):
        RewardSpec(name="think_format", kwargs={"x": 1})
    with pytest.raises(ValidationError, match="kwargs.think_in_prompt: Input should be a valid b"):
        RewardSpec(name="think_format", kwargs={"think_in_prompt": "yes"})
    with pytest.raises(ValidationError, match="did you mean 'math_verify'"):
        RewardSpec(name="math_verfy")
