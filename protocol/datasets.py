"""Where a run's prompts come from: built-in generators with a seed, or JSONL rows.

Pure Python (no torch, no web stack): the server validates and stores rows, the CLI and the
dashboard parse JSONL files with the same rules.

A row is a dict with a `prompt` (a non-empty string, or a list of chat messages
`{"role": "system" | "user" | "assistant", "content": str}`) and any number of reference
columns (e.g. `answer`) that only the learner's rewards see.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from protocol.error_codes import ErrorCode

# Inline (run config) and dashboard-parsed JSONL; larger files are uploaded datasets.
MAX_JSONL_ROWS = 1_000
MAX_GENERATOR_SIZE = 1_000_000
CHAT_ROLES = ("system", "user", "assistant")

Prompt = str | list[dict[str, str]]


class DatasetError(ValueError):
    """A dataset row, file or generator request that cannot be used; `code` names the check
    (the API's error code), None for the generic one (`invalid_dataset_file`)."""

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PromptRecord:
    """One dataset row split into what workers see and what only the learner sees."""

    prompt: Prompt
    reference: dict[str, Any] = field(default_factory=dict)


Generator = Callable[[int, int], list[dict[str, Any]]]
GENERATORS: dict[str, Generator] = {}


def register_generator(name: str) -> Callable[[Generator], Generator]:
    """Add a built-in generator `f(size, seed) -> rows` under `name`."""

    def wrap(fn: Generator) -> Generator:
        GENERATORS[name] = fn
        return fn

    return wrap


def _additions(size: int, seed: int, low: int, high: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        a, b = rng.randint(low, high), rng.randint(low, high)
        rows.append(
            {
                "prompt": f"What is {a} + {b}? Answer with just the number.",
                "answer": str(a + b),
            }
        )
    return rows


@register_generator("arithmetic")
def arithmetic(size: int, seed: int) -> list[dict[str, Any]]:
    """2-digit additions, e.g. "What is 45 + 98? Answer with just the number." with the
    reference column `answer` = "143" (a string integer). The same seed gives the same rows."""
    return _additions(size, seed, 10, 99)


@register_generator("arithmetic_easy")
def arithmetic_easy(size: int, seed: int) -> list[dict[str, Any]]:
    """Single-digit additions in the same form ("What is 7 + 5? …", `answer` "12"): the small
    model gets some right and some wrong from the start, so its groups carry a signal (the
    demo's task)."""
    return _additions(size, seed, 1, 9)


@register_generator("products")
def products(size: int, seed: int) -> list[dict[str, Any]]:
    """Products of a 5-digit and a 4-digit number, e.g. "What is 48213 * 9177? …" with
    `answer` "442450701": beyond mental arithmetic for a small model, a task for the
    `calculator` tool of the `tool_calls` environment. The same seed gives the same rows."""
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        a, b = rng.randint(10_000, 99_999), rng.randint(1_000, 9_999)
        rows.append(
            {
                "prompt": f"What is {a} * {b}? Answer with just the number.",
                "answer": str(a * b),
            }
        )
    return rows


def check_generator(name: str, size: int) -> None:
    """Raise DatasetError when the generator is unknown or the size is out of range."""
    if name not in GENERATORS:
        known = ", ".join(sorted(GENERATORS))
        raise DatasetError(f"unknown generator {name!r}; built-in generators: {known}")
    if not 1 <= size <= MAX_GENERATOR_SIZE:
        raise DatasetError(f"size must be between 1 and {MAX_GENERATOR_SIZE:,} (got {size})")


def generate(name: str, size: int, seed: int) -> list[dict[str, Any]]:
    """Rows of the built-in generator `name`."""
    check_generator(name, size)
    return GENERATORS[name](size, seed)


def check_prompt(prompt: Any) -> Prompt:
    """A prompt is a non-empty string or a non-empty list of {role, content} messages."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DatasetError("prompt must be a non-empty string")
        return prompt
    if not isinstance(prompt, list) or not prompt:
        raise DatasetError(
            "prompt must be a non-empty string or a non-empty list of {role, content} messages"
        )
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise DatasetError(
                f"prompt message {i} must be an object with exactly role and content"
            )
        if message["role"] not in CHAT_ROLES:
            raise DatasetError(
                f"prompt message {i} has role {message['role']!r}; "
                f"roles are {', '.join(CHAT_ROLES)}"
            )
        if not isinstance(message["content"], str):
            raise DatasetError(f"prompt message {i} content must be a string")
    return prompt


def check_row(row: Any) -> dict[str, Any]:
    """Validate one row: an object with a valid `prompt` plus reference columns."""
    if not isinstance(row, dict):
        raise DatasetError("a row must be a JSON object with a `prompt`")
    if "prompt" not in row:
        raise DatasetError("row has no `prompt` column")
    check_prompt(row["prompt"])
    return row


def split_row(row: dict[str, Any]) -> PromptRecord:
    """The prompt and the reference columns (everything except `prompt`)."""
    return PromptRecord(
        prompt=row["prompt"], reference={k: v for k, v in row.items() if k != "prompt"}
    )


def parse_jsonl(lines: Iterable[str] | str) -> list[dict[str, Any]]:
    """Parse JSONL text (blank lines skipped) into validated rows; errors name the line."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(rows) >= MAX_JSONL_ROWS:
            raise DatasetError(f"at most {MAX_JSONL_ROWS:,} rows per dataset")
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"line {number}: invalid JSON ({exc.msg})") from exc
        except ValueError:  # an integer of more digits than Python converts
            raise DatasetError(
                f"line {number}: invalid JSON (a number with too many digits)"
            ) from None
        except RecursionError:
            raise DatasetError(f"line {number}: invalid JSON (nested too deeply)") from None
        try:
            rows.append(check_row(row))
        except DatasetError as exc:
            raise DatasetError(f"line {number}: {exc}") from exc
    if not rows:
        raise DatasetError("a JSONL dataset needs at least one row")
    return rows


@register_generator("word_problems")
def word_problems(size: int, seed: int) -> list[dict[str, Any]]:
    """Grade-school word problems in GSM8K's style (protocol/word_problems.py): `prompt` is the
    question, `answer` the final number (a string integer) and `solution` GSM8K's worked
    answer ending in `#### <n>`."""
    from protocol.word_problems import final_answer, problems

    return [
        {"prompt": p["question"], "answer": final_answer(p["answer"]), "solution": p["answer"]}
        for p in problems(size, seed)
    ]
