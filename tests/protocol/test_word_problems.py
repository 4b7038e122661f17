"""The project's own GSM8K-format word problems: every worked answer is right, the files in
examples/data were written by the script, and the generator kind serves them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from protocol import datasets
from protocol.word_problems import TEMPLATES, final_answer, problems

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "word-problems"
_STEP = re.compile(r"<<([0-9+\-*/ ]+)=(\d+)>>")


def _evaluate(expression: str) -> int:
    left, op, right = re.fullmatch(r"(\d+)([+\-*/])(\d+)", expression.replace(" ", "")).groups()
    a, b = int(left), int(right)
    if op == "/":
        assert a % b == 0, f"{expression} does not divide evenly"
        return a // b
    return {"+": a + b, "-": a - b, "*": a * b}[op]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_calculator_step_and_final_answer_is_right(seed: int) -> None:
    rows = problems(300, seed)
    for row in rows:
        steps = _STEP.findall(row["answer"])
        assert steps, row
        for expression, result in steps:
            assert _evaluate(expression) == int(result), row
        assert final_answer(row["answer"]) == steps[-1][1]
        assert int(final_answer(row["answer"])) >= 0


def test_the_same_seed_gives_the_same_problems_and_all_templates_appear() -> None:
    assert problems(50, 3) == problems(50, 3)
    assert problems(50, 3) != problems(50, 4)
    openings = {row["question"].split(".")[0][-12:] for row in problems(400, 0)}
    assert len(openings) > len(TEMPLATES)


def test_committed_files_are_what_the_script_writes(tmp_path: Path) -> None:
    import runpy

    script = runpy.run_path(str(ROOT / "examples" / "data" / "make_word_problems.py"))
    written = script["write"](tmp_path)
    for name, path in written.items():
        assert path.read_bytes() == (DATA / f"{name}.jsonl").read_bytes(), name


def test_test_split_shares_no_question_with_train() -> None:
    def questions(name: str) -> set[str]:
        lines = (DATA / f"{name}.jsonl").read_text().splitlines()
        return {json.loads(line)["question"] for line in lines}

    assert len(questions("test")) == 128
    assert not questions("train") & questions("test")


def test_generator_kind_gives_prompt_answer_and_solution() -> None:
    rows = datasets.generate("word_problems", 5, 0)
    expected = problems(5, 0)
    assert [r["prompt"] for r in rows] == [p["question"] for p in expected]
    assert [r["solution"] for r in rows] == [p["answer"] for p in expected]
    assert [r["answer"] for r in rows] == [final_answer(p["answer"]) for p in expected]
