"""Built-in generators and JSONL parsing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from protocol import datasets
from protocol.datasets import DatasetError, generate, parse_jsonl, split_row
from protocol.rewards import numeric_match

PATTERN = re.compile(r"^What is (\d{2}) \+ (\d{2})\? Answer with just the number\.$")


def test_arithmetic_rows_are_two_digit_additions_with_string_answers() -> None:
    rows = generate("arithmetic", 200, seed=7)
    assert len(rows) == 200
    for row in rows:
        match = PATTERN.match(row["prompt"])
        assert match, row["prompt"]
        a, b = int(match.group(1)), int(match.group(2))
        assert isinstance(row["answer"], str)
        assert int(row["answer"]) == a + b
    # the reward scores the generator's own reference as correct
    assert (
        numeric_match(
            [r["prompt"] for r in rows],
            [r["answer"] for r in rows],
            answer=[r["answer"] for r in rows],
        )
        == [1.0] * 200
    )


def test_arithmetic_is_seeded() -> None:
    assert generate("arithmetic", 50, seed=1) == generate("arithmetic", 50, seed=1)
    assert generate("arithmetic", 50, seed=1) != generate("arithmetic", 50, seed=2)


PRODUCT = re.compile(r"^What is (\d{5}) \* (\d{4})\? Answer with just the number\.$")


def test_products_rows_are_large_products_with_string_answers_and_seeded() -> None:
    rows = generate("products", 100, seed=3)
    for row in rows:
        match = PRODUCT.match(row["prompt"])
        assert match, row["prompt"]
        assert row["answer"] == str(int(match.group(1)) * int(match.group(2)))
    assert numeric_match([r["prompt"] for r in rows], [r["answer"] for r in rows],
                         answer=[r["answer"] for r in rows]) == [1.0] * 100  # fmt: skip
    assert generate("products", 20, seed=3) == rows[:20]
    assert generate("products", 20, seed=4) != rows[:20]


def test_generator_checks() -> None:
    with pytest.raises(DatasetError, match="unknown generator 'nope'; built-in generators: "):
        generate("nope", 10, 0)
    with pytest.raises(DatasetError, match="size must be between 1 and 1,000,000"):
        generate("arithmetic", 0, 0)


def test_split_row_separates_reference_columns() -> None:
    record = split_row({"prompt": "2+2?", "answer": "4", "level": 1})
    assert record.prompt == "2+2?"
    assert record.reference == {"answer": "4", "level": 1}


def test_parse_jsonl_rows(tmp_path: Path) -> None:
    rows = [
        {"prompt": "What is 1 + 2?", "answer": "3"},
        {
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2 + 2?"},
            ],
            "answer": "4",
        },
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert parse_jsonl(path.read_text()) == rows


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "a"}\n{"prompt": ', "line 2: invalid JSON"),
        ('{"answer": "1"}', "line 1: row has no `prompt` column"),
        ('["prompt"]', "line 1: a row must be a JSON object"),
        ('{"prompt": ""}', "line 1: prompt must be a non-empty string"),
        ('{"prompt": [{"role": "robot", "content": "x"}]}', "line 1: prompt message 0 has role"),
        ("\n\n", "at least one row"),
        # ValueError and RecursionError from json.loads, not JSONDecodeError (were tracebacks)
        ('{"prompt": "a", "n": ' + "9" * 5000 + "}", "line 1: invalid JSON (a number with too"),
        ('{"prompt": "a", "n": ' + "[" * 100_000 + "]" * 100_000 + "}", "line 1: invalid JSON"),
    ],
)
def test_parse_jsonl_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(DatasetError, match=re.escape(message)):
        parse_jsonl(text)


def test_parse_jsonl_row_limit() -> None:
    text = '{"prompt": "p"}\n' * (datasets.MAX_JSONL_ROWS + 1)
    with pytest.raises(DatasetError, match="at most 1,000 rows"):
        parse_jsonl(text)
