"""The built-in rewards `math_verify` and `think_format` (listed in protocol/rewards.py).

`math_verify` grades like TRL's accuracy reward, with the `math-verify` library (imported on
first use: the learner extra installs it, the server never calls it): the completion's answer
is its last `\\boxed{…}` or, when it has none, its last number (thousands separators allowed);
the reference is the column named by `column` (default `answer`; for a GSM8K answer
"… #### 72" what follows the last `####`; a bare answer such as `2\\sqrt{2}` is read whole,
see `reference_latex`). Both are parsed to SymPy and compared with
`math_verify.verify` (1/2, 0.5 and \\frac{1}{2} are equal). A reference that does not parse
scores None (skipped, as TRL does); a completion without an answer or with a wrong one, 0.0.

math-verify guards each parse and comparison with SIGALRM, which only a process's main thread
may install. The learner calls rewards in its reward processes' main threads (5 s guards, the
library's default); called from any other thread, the guards are off (`None`, the library's
way to disable them) and only the caller's own timeout (the reward pool's per-batch one)
bounds a pathological expression.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from protocol.rewards_base import RewardError, last_number_text, text_of

GUARD_S = 5  # math-verify's per-expression timeout, in the main thread only
_BOXED = "\\boxed"
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")
_THINK = re.compile(r"\s*<think>(?P<thought>.*?)</think>(?P<answer>.*)", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{…}` of `text` (nested braces balanced), or None."""
    start = text.rfind(_BOXED)
    while start != -1:
        i = start + len(_BOXED)
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    return text[i + 1 : j]
        start = text.rfind(_BOXED, 0, start)
    return None


def _plain(number: str) -> str:
    return number.replace(",", "") if _THOUSANDS.fullmatch(number.strip()) else number


def extract_answer(completion: str) -> str | None:
    """What `math_verify` grades: the last boxed content, else the last number, else None."""
    boxed = last_boxed(completion)
    if boxed is not None and boxed.strip():
        return "\\boxed{" + _plain(boxed.strip()) + "}"
    number = last_number_text(completion)
    return _plain(number) if number is not None else None


def reference_text(value: Any) -> str:
    """A reference as text: what follows the last `####` of a GSM8K answer, else all of it."""
    text = str(value)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return _plain(text.strip())


def reference_latex(text: str) -> str:
    """What the reference's parse reads. A bare answer (`2\\sqrt{2}`, `(x+1)^2`, `0.5`: no
    `$`, no `\\boxed`, no word of two letters outside LaTeX commands) is read whole, as
    math (`$…$`): math-verify's own search would stop at the `2` of `2\\sqrt{2}`. Anything
    else (a solution with `\\boxed` or `$`, a sentence) goes to math-verify's search."""
    if "$" in text or _BOXED in text or _WORD.search(_COMMAND.sub("", text)):
        return text
    return f"${text}$"


def _guard() -> int | None:
    return GUARD_S if threading.current_thread() is threading.main_thread() else None


def _grade(answer: str | None, reference: Any) -> float | None:
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    guard = _guard()
    text = reference_latex(reference_text(reference))
    gold = parse(text, extraction_mode="first_match", parsing_timeout=guard)
    if not gold:
        return None
    if answer is None:
        return 0.0
    latex = LatexExtractionConfig(
        normalization_config=NormalizationConfig(
            nits=False, malformed_operators=False, basic_latex=True, boxed="all", units=True
        ),
        boxed_match_priority=0,
    )
    got = parse(
        answer,
        extraction_config=[latex, ExprExtractionConfig()],
        extraction_mode="first_match",
        parsing_timeout=guard,
    )
    if not got:
        return 0.0
    return 1.0 if verify(gold, got, timeout_seconds=guard) else 0.0


def math_verify(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    column: str = "answer",
    **columns: Any,
) -> list[float | None]:
    """1.0 when the completion's last `\\boxed{}` (else its last number) equals the reference
    in the column `column` symbolically, else 0.0; None where the reference does not parse."""
    references = columns.get(column) if isinstance(column, str) else None
    if references is None:
        raise RewardError(
            f"math_verify needs the reference column {column!r} (its `column` kwarg); the "
            f"batch has: {', '.join(sorted(columns)) or 'no reference columns'}"
        )
    scores: list[float | None] = []
    for completion, reference in zip(completions, references, strict=True):
        if reference is None:
            scores.append(None)
            continue
        scores.append(_grade(extract_answer(text_of(completion)), reference))
    return scores


def think_format(
    prompts: Sequence[Any], completions: Sequence[Any], think_in_prompt: bool = False, **_: Any
) -> list[float | None]:
    """1.0 when the completion is, after optional leading whitespace, one `<think>…</think>`
    block with a non-blank thought, then a non-blank answer, with no other `<think>` or
    `</think>` anywhere; else 0.0. With `think_in_prompt` (chat templates that end the prompt
    with `<think>`, as Qwen3's and DeepSeek-R1's), the completion starts inside the thought:
    a non-blank thought, one `</think>`, a non-blank answer, no `<think>`."""
    return [1.0 if is_think_format(text_of(c), think_in_prompt) else 0.0 for c in completions]


def is_think_format(text: str, think_in_prompt: bool = False) -> bool:
    if think_in_prompt:
        text = "<think>" + text if "<think>" not in text else ""
    found = _THINK.fullmatch(text)
    if found is None or text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    return bool(found["thought"].strip()) and bool(found["answer"].strip())


def check_think_format(kwargs: dict[str, Any]) -> None:
    flag = kwargs.get("think_in_prompt", False)
    if not isinstance(flag, bool):
        raise RewardError(f"think_format: think_in_prompt must be true or false (got {flag!r})")


def check_math_verify(kwargs: dict[str, Any]) -> None:
    column = kwargs.get("column", "answer")
    if not isinstance(column, str) or not column.strip() or len(column) > 200:
        raise RewardError(
            f"math_verify: column must be the name of a reference column, a non-empty string "
            f"of at most 200 characters (got {column!r})"
        )
