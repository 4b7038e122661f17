"""The reward registry (pure Python, no torch).

Reward functions have TRL's signature `f(prompts, completions, **columns) -> list[float]`:
`prompts` and `completions` are aligned lists (one entry per completion; completions are decoded
strings), and every reference column of the prompt rows is passed as a keyword argument holding
one value per completion. A function may return None for a completion it does not apply to
(as in TRL); `combine` then skips it in the weighted sum.

Built-ins: `numeric_match`, `answer_format`, `length_limit`, `hash_score` (no signal: for speed
checks with random weights, bench/gpu_check.py). User code: `"module:function"`,
imported lazily (by the learner, never at run validation, where only the syntax is checked).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

RewardFn = Callable[..., list[float | None]]

_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_USER_REF = re.compile(rf"^{_IDENT}(?:\.{_IDENT})*:{_IDENT}$")


class RewardError(ValueError):
    """A reward that cannot be resolved or returned something unusable."""


def _text(completion: Any) -> str:
    """A completion as text: a string, or TRL's conversational [{role, content}] form."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def _number(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").strip())
    except InvalidOperation:
        return None


def last_number(text: str) -> Decimal | None:
    """The last integer or decimal number in `text` (thousands separators allowed)."""
    found = _NUMBER.findall(text)
    return _number(found[-1]) if found else None


def numeric_match(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answer: Sequence[Any] | None = None,
    **_: Any,
) -> list[float | None]:
    """1.0 when the last number in the completion equals the `answer` column, else 0.0."""
    if answer is None:
        raise RewardError("numeric_match needs an `answer` reference column")
    scores: list[float | None] = []
    for completion, expected in zip(completions, answer, strict=True):
        want = _number(str(expected)) if expected is not None else None
        got = last_number(_text(completion))
        scores.append(1.0 if want is not None and got is not None and got == want else 0.0)
    return scores


def answer_format(
    prompts: Sequence[Any], completions: Sequence[Any], **_: Any
) -> list[float | None]:
    """1.0 when the completion contains an `<answer>…</answer>` pair, else 0.0."""
    return [1.0 if _ANSWER_TAG.search(_text(c)) else 0.0 for c in completions]


def length_limit(
    prompts: Sequence[Any], completions: Sequence[Any], max_chars: int = 200, **_: Any
) -> list[float | None]:
    """1.0 up to `max_chars` characters, then falling linearly to 0.0 at twice the limit."""
    if max_chars < 1:
        raise RewardError("length_limit needs max_chars >= 1")
    scores: list[float | None] = []
    for completion in completions:
        excess = len(_text(completion)) - max_chars
        scores.append(1.0 if excess <= 0 else max(0.0, 1.0 - excess / max_chars))
    return scores


def hash_score(
    prompts: Sequence[Any], completions: Sequence[Any], salt: str = "", **_: Any
) -> list[float | None]:
    """A score in [0, 1) read off the sha256 of `salt` + the completion's text: the same text
    always scores the same, different texts score apart. It rewards nothing in particular, so
    that a model with random weights (whose completions a real reward scores all alike, and
    all-equal groups are skipped) still trains on every group: speed checks only."""
    scores: list[float | None] = []
    for completion in completions:
        digest = hashlib.sha256((salt + _text(completion)).encode()).digest()
        scores.append(int.from_bytes(digest[:8], "big") / 2**64)
    return scores


BUILTINS: dict[str, RewardFn] = {
    "numeric_match": numeric_match,
    "answer_format": answer_format,
    "length_limit": length_limit,
    "hash_score": hash_score,
}


def check_name(name: str) -> None:
    """Raise RewardError unless `name` is a built-in or has `module:function` syntax.
    Nothing is imported: user modules exist only where the learner runs."""
    if name in BUILTINS or _USER_REF.match(name):
        return
    known = ", ".join(sorted(BUILTINS))
    raise RewardError(
        f"unknown reward {name!r}: use a built-in ({known}) or 'module:function' "
        "(dotted module path, a colon, a function name)"
    )


def check_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    """For built-ins, refuse keyword arguments the function does not take."""
    fn = BUILTINS.get(name)
    if fn is None:
        return
    params = inspect.signature(fn).parameters
    allowed = [p for p in params if p not in ("prompts", "completions", "_")]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        hint = ", ".join(allowed) if allowed else "none"
        raise RewardError(f"{name} takes no argument {', '.join(unknown)} (it takes: {hint})")


def resolve(name: str) -> RewardFn:
    """The callable for a built-in name, or the imported `module:function`."""
    if name in BUILTINS:
        return BUILTINS[name]
    check_name(name)
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardError(f"cannot import reward module {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"{module_name!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


class RewardSpecLike(Protocol):
    name: str
    weight: float
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class CombinedRewards:
    """Per-completion weighted totals and each reward's raw values (None → NaN)."""

    total: list[float]
    per_reward: dict[str, list[float]]


def _values(name: str, out: Any, n: int) -> list[float]:
    if not isinstance(out, list | tuple) or len(out) != n:
        got = len(out) if isinstance(out, list | tuple) else type(out).__name__
        raise RewardError(f"reward {name!r} must return a list of {n} floats (got {got})")
    values = []
    for v in out:
        if v is None:
            values.append(math.nan)
        elif isinstance(v, int | float) and not isinstance(v, bool):
            values.append(float(v))
        else:
            raise RewardError(f"reward {name!r} returned {type(v).__name__}, not a number")
    return values


def score_one(
    name: str,
    kwargs: dict[str, Any],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, Sequence[Any]],
) -> list[float]:
    """One reward's values on aligned completions (None → NaN); RewardError when unusable."""
    fn = resolve(name)
    out = fn(list(prompts), list(completions), **{**columns, **kwargs})
    return _values(name, out, len(completions))


def check_aligned(
    prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, Sequence[Any]]
) -> None:
    n = len(completions)
    if len(prompts) != n or any(len(col) != n for col in columns.values()):
        raise RewardError("prompts, completions and every column need one entry per completion")


def weighted(
    specs: Sequence[RewardSpecLike], values: Sequence[list[float]], n: int
) -> CombinedRewards:
    """Sum `weight × value` over the rewards' values (one list of n per spec, in order; NaN
    values are skipped, as TRL's nansum). Keys of `per_reward` are the reward names, suffixed
    #2, #3… on repeats."""
    total = [0.0] * n
    per_reward: dict[str, list[float]] = {}
    for spec, spec_values in zip(specs, values, strict=True):
        key, k = spec.name, 1
        while key in per_reward:
            k += 1
            key = f"{spec.name}#{k}"
        per_reward[key] = spec_values
        for i, v in enumerate(spec_values):
            if not math.isnan(v):
                total[i] += spec.weight * v
    return CombinedRewards(total=total, per_reward=per_reward)


def combine(
    specs: Sequence[RewardSpecLike],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, Sequence[Any]],
) -> CombinedRewards:
    """Call every reward in this process and sum their weighted values (`weighted`). The
    learner scores through learner/reward_pool.py instead, in child processes."""
    check_aligned(prompts, completions, columns)
    values = [score_one(s.name, s.kwargs, prompts, completions, columns) for s in specs]
    return weighted(specs, values, len(completions))
