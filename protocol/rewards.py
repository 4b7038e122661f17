"""The reward registry (pure Python, no torch).

Reward functions have TRL's signature `f(prompts, completions, **columns) -> list[float]`:
`prompts` and `completions` are aligned lists (one entry per completion; completions are decoded
strings), and every reference column of the prompt rows is passed as a keyword argument holding
one value per completion. A function may return None for a completion it does not apply to
(as in TRL); `combine` then skips it in the weighted sum.

Built-ins: `numeric_match`, `answer_format`, `length_limit`, `hash_score` (no signal: for speed
checks with random weights, bench/gpu_check.py), `math_verify` and `think_format`
(protocol/rewards_math.py), `llm_judge` (protocol/rewards_judge.py), `worker_score` (a trusted
worker's environment score; runs requiring trusted workers only); this module is the one list of
them (`BUILTINS`; `KWARG_MODELS`, each one's keyword parameters as a strict pydantic model read off
its signature, and `KWARG_CHECKS`, for their kwargs at run creation). User code comes only from what
the learner's operator allows where the learner runs (`RewardAllowlist`): an entry point of the
group `asyncgrpo.rewards`, named in the run by its entry-point name, or `"module:function"` of a
module listed with `--reward-module`. Run validation checks the syntax only (the server cannot know
what a learner host allows) and refuses standard-library modules (`os:system`), which are never a
reward; the learner imports nothing outside its allowlist (docs/architecture/loss.md, "Rewards").
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.metadata
import inspect
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from protocol.rewards_base import RewardError, last_number, text_of, to_decimal
from protocol.rewards_judge import check_llm_judge, llm_judge
from protocol.rewards_math import (
    check_math_verify,
    check_think_format,
    math_verify,
    think_format,
)

RewardFn = Callable[..., list[float | None]]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Patterns are anchored with \A and \Z (`$` also matches before a trailing newline).
MODULE_PATTERN = rf"{_IDENT}(?:\.{_IDENT})*"  # a dotted module path, unanchored
MODULE_PATH = re.compile(rf"\A{MODULE_PATTERN}\Z")  # as `--reward-module` takes it
_USER_REF = re.compile(rf"\A{MODULE_PATTERN}:{_IDENT}\Z")
_ENTRY_POINT_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_.\-]{0,199}\Z")
MAX_NAME_CHARS = 200  # a reward's or an environment's name (protocol/environments.py)
ENTRY_POINT_GROUP = "asyncgrpo.rewards"
ANY_FUNCTION = "*"  # `module:*` in a learner's reported names: any function of an allowed module


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
        want = to_decimal(str(expected)) if expected is not None else None
        got = last_number(text_of(completion))
        scores.append(1.0 if want is not None and got is not None and got == want else 0.0)
    return scores


def answer_format(
    prompts: Sequence[Any], completions: Sequence[Any], **_: Any
) -> list[float | None]:
    """1.0 when the completion contains an `<answer>…</answer>` pair, else 0.0."""
    return [1.0 if _ANSWER_TAG.search(text_of(c)) else 0.0 for c in completions]


def length_limit(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    max_chars: Annotated[int, Field(ge=1)] = 200,
    **_: Any,
) -> list[float | None]:
    """1.0 up to `max_chars` characters, then falling linearly to 0.0 at twice the limit."""
    if max_chars < 1:
        raise RewardError("length_limit needs max_chars >= 1")
    scores: list[float | None] = []
    for completion in completions:
        excess = len(text_of(completion)) - max_chars
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
        digest = hashlib.sha256((salt + text_of(completion)).encode()).digest()
        scores.append(int.from_bytes(digest[:8], "big") / 2**64)
    return scores


WORKER_SCORE = "worker_score"  # the `info` key a trusted worker's environment scores into


def worker_score(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    info: Sequence[Any] | None = None,
    **_: Any,
) -> list[float | None]:
    """The score the worker's environment recorded in the trajectory's `info["worker_score"]`
    (a `verifiers` rubric run on the worker); None where there is none. Only runs whose
    environment requires trusted workers may use it (protocol/run_config.py): on any other run
    the worker, who wrote `info`, would choose its own reward."""
    rows = list(info) if info is not None else [None] * len(completions)
    scores: list[float | None] = []
    for row in rows:
        value = row.get(WORKER_SCORE) if isinstance(row, Mapping) else None
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        scores.append(float(number) if number is not None and math.isfinite(number) else None)
    return scores


BUILTINS: dict[str, RewardFn] = {
    "numeric_match": numeric_match,
    "answer_format": answer_format,
    "length_limit": length_limit,
    "hash_score": hash_score,
    "math_verify": math_verify,
    "think_format": think_format,
    "llm_judge": llm_judge,
    WORKER_SCORE: worker_score,
}


def _kwargs_model(name: str, fn: RewardFn) -> type[BaseModel]:
    """The built-in's keyword parameters (names, types, constraints and defaults, as its
    signature declares them) as a strict model: `max_chars` "x" or [1] is refused, not cast."""
    params = inspect.signature(fn, eval_str=True).parameters.values()
    fields: dict[str, Any] = {
        p.name: (p.annotation, p.default)
        for p in params
        if p.name not in ("prompts", "completions") and p.kind is not p.VAR_KEYWORD
    }
    config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    return create_model(f"{name}_kwargs", __config__=config, **fields)


# Each built-in's kwargs, typed: checked at run creation (`check_kwargs`).
KWARG_MODELS: dict[str, type[BaseModel]] = {
    name: _kwargs_model(name, fn) for name, fn in BUILTINS.items()
}
# Built-ins whose kwargs need more than their types (ranges, no secrets), with their own
# messages: checked at run creation, so that a run never starts with a reward that cannot work.
KWARG_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "math_verify": check_math_verify,
    "think_format": check_think_format,
    "llm_judge": check_llm_judge,
}


def check_name(name: str) -> None:
    """Raise RewardError unless `name` is a built-in, an entry-point name or `module:function`
    of a module outside the standard library. Nothing is imported: user modules exist only
    where the learner runs, and only its operator's allowlist decides which load."""
    if name in BUILTINS:
        return
    check_name_length("reward", name)
    if _USER_REF.match(name):
        _refuse_stdlib(name)
        return
    near = difflib.get_close_matches(name, BUILTINS, n=1, cutoff=0.8)
    if _ENTRY_POINT_NAME.match(name) and not near:
        return
    known = ", ".join(sorted(BUILTINS))
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise RewardError(
        f"unknown reward {name!r}{hint}: use a built-in ({known}), the name of an entry point "
        f"in the group {ENTRY_POINT_GROUP!r} or 'module:function' (dotted module path, a colon, "
        "a function name)"
    )


def check_name_length(kind: str, name: str) -> None:
    """Refuse a reward's or an environment's name over MAX_NAME_CHARS (the name not echoed)."""
    if len(name) > MAX_NAME_CHARS:
        raise RewardError(
            f"the {kind} name is {len(name):,} characters long; at most {MAX_NAME_CHARS}",
            code="name_too_long",
        )


def _refuse_stdlib(name: str) -> None:
    module_name = name.partition(":")[0]
    if module_name.split(".")[0] in sys.stdlib_module_names:
        raise RewardError(
            f"reward {name!r}: module {module_name!r} is part of Python's standard library; a "
            "reward comes from a user module or entry point that the learner's operator allows"
        )


def check_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    """For built-ins, refuse keyword arguments the function does not take, then values not of
    the declared type (`KWARG_MODELS`: RewardError naming the kwarg), then values the
    built-in's own check (`KWARG_CHECKS`: ranges, no secrets) refuses."""
    model = KWARG_MODELS.get(name)
    if model is None:
        return
    allowed = list(model.model_fields)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown and name in KWARG_CHECKS:
        KWARG_CHECKS[name](kwargs)  # a precise refusal first (a key given as `api_key`)
    if unknown:
        hint = ", ".join(allowed) if allowed else "none"
        raise RewardError(f"{name} takes no argument {', '.join(unknown)} (it takes: {hint})")
    try:
        model.model_validate(kwargs)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        kwarg = str(first["loc"][0])
        raise RewardError(
            f"{name}: kwargs.{kwarg}: {first['msg']} (got {kwargs[kwarg]!r:.80})",
            code="reward_kwarg_invalid",
            kwarg=kwarg,
        ) from None
    if name in KWARG_CHECKS:
        KWARG_CHECKS[name](kwargs)


def columns_read(name: str, kwargs: Mapping[str, Any]) -> set[str] | None:
    """The reference columns a reward cannot work without (run creation checks the dataset has
    them); None when not known (user rewards, the judge, whose template decides)."""
    if name == "numeric_match":
        return {"answer"}
    if name == "math_verify":
        return {str(kwargs.get("column", "answer"))}
    if name in BUILTINS and name != "llm_judge":
        return set()
    return None


def works_without_kwargs(name: str) -> bool:
    """Whether a built-in may be named with no kwargs (the dashboard's checkboxes offer only
    those; `llm_judge` needs its endpoint)."""
    try:
        check_kwargs(name, {})
    except RewardError:
        return False
    return True


@dataclass(frozen=True)
class RewardAllowlist:
    """The user rewards a learner host may load, as its operator configured them: modules
    (`--reward-module`; their `module:function` names load) and the installed entry points of
    the group `asyncgrpo.rewards` (name → `module:attr`). Built-ins are always allowed. It is
    passed to the reward processes, which resolve names against it and import nothing else."""

    modules: frozenset[str] = frozenset()
    entry_points: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def discover(cls, modules: Iterable[str] = ()) -> RewardAllowlist:
        """The given modules and the entry points installed where this process runs."""
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        return cls(frozenset(modules), {ep.name: ep.value for ep in found})

    def names(self) -> list[str]:
        """What the learner reports at attach: built-ins, entry-point names and `module:*`
        for each allowed module."""
        modules = [f"{m}:{ANY_FUNCTION}" for m in sorted(self.modules)]
        return sorted(BUILTINS) + sorted(self.entry_points) + modules


BUILTINS_ONLY = RewardAllowlist()


def not_loadable(names: Iterable[str], loadable: Iterable[str]) -> list[str]:
    """The run's reward names a learner cannot load, given the names it reported
    (`RewardAllowlist.names`: exact names and `module:*`)."""
    known = set(loadable)
    missing = []
    for name in names:
        module = name.partition(":")[0]
        if name in BUILTINS or name in known or f"{module}:{ANY_FUNCTION}" in known:
            continue
        if name not in missing:
            missing.append(name)
    return missing


def resolve(name: str, allowed: RewardAllowlist = BUILTINS_ONLY) -> RewardFn:
    """The callable for a built-in name, an allowed entry point or `module:function` of an
    allowed module; RewardError (and nothing imported) for anything else."""
    if name in BUILTINS:
        return BUILTINS[name]
    check_name(name)
    if name in allowed.entry_points:
        return _load_entry_point(name, allowed.entry_points[name])
    if not _USER_REF.match(name):
        raise RewardError(
            f"reward {name!r} is not an entry point of the group {ENTRY_POINT_GROUP!r} "
            "installed where the learner runs"
        )
    module_name, _, attr = name.partition(":")
    if module_name not in allowed.modules:
        raise RewardError(
            f"reward module {module_name!r} is not allowed on this learner host: its operator "
            "allows modules with --reward-module (ASYNCGRPO_LEARNER_REWARD_MODULES) and entry "
            f"points of the group {ENTRY_POINT_GROUP!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardError(f"cannot import reward module {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"{module_name!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


def _load_entry_point(name: str, value: str) -> RewardFn:
    entry = importlib.metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)
    try:
        fn = entry.load()
    except (ImportError, AttributeError) as exc:
        raise RewardError(f"cannot load the reward entry point {name!r} ({value}): {exc}") from exc
    if not callable(fn):
        raise RewardError(f"the reward entry point {name!r} ({value}) is not callable")
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
    allowed: RewardAllowlist = BUILTINS_ONLY,
) -> list[float]:
    """One reward's values on aligned completions (None → NaN); RewardError when unusable."""
    fn = resolve(name, allowed)
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
    allowed: RewardAllowlist = BUILTINS_ONLY,
) -> CombinedRewards:
    """Call every reward in this process and sum their weighted values (`weighted`). The
    learner scores through learner/reward_pool.py instead, in child processes."""
    check_aligned(prompts, completions, columns)
    values = [score_one(s.name, s.kwargs, prompts, completions, columns, allowed) for s in specs]
    return weighted(specs, values, len(completions))
