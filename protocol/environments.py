"""A run's environment: which rollout loop a worker runs for it, and with what limits.

An environment turns one prompt into one trajectory (protocol/trajectories.py) by calling the
worker's engine turn by turn (worker/environments/). Built-ins: `single_turn` (one generation:
the behaviour of every run so far, and the default), `tool_calls` (the model may call tools,
whose results come back as tool messages) and `guess_number` (a small multi-turn game where the
environment answers "higher"/"lower" as user turns; for tests and demos).

User environments load like user rewards (protocol/rewards.py): only what the worker's operator
allows where the worker runs (`EnvironmentAllowlist`): an entry point of the group
`asyncgrpo.environments` named in the run by its entry-point name, or `module:Class` of a module
listed in `ASYNCGRPO_WORKER_ENVIRONMENT_MODULES`. Run validation checks the syntax only and
refuses standard-library modules; a run never makes a worker import code its operator did not
allow. `verifiers:<module>` names a `verifiers` environment module (the `verifiers` extra,
worker/environments/verifiers_env.py), allowed like the module `<module>`.

`EnvironmentConfig` is `RunConfig.environment` (default `EnvironmentConfig()`, i.e.
`single_turn`), e.g. `{"name": "tool_calls", "tools": ["calculator"], "max_turns": 4,
"max_total_tokens": 1024}`.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from protocol.config_base import Rule, _fail, _Strict
from protocol.rewards import MAX_NAME_CHARS, MODULE_PATTERN, RewardError, check_name_length
from protocol.schemas import KIB, free_json

ENTRY_POINT_GROUP = "asyncgrpo.environments"
SINGLE_TURN, TOOL_CALLS, GUESS_NUMBER = "single_turn", "tool_calls", "guess_number"
BUILTIN_ENVIRONMENTS = (SINGLE_TURN, TOOL_CALLS, GUESS_NUMBER)
BUILTIN_TOOLS = ("calculator",)
# What each built-in does, one sentence each (docs/reference/run-config.md lists them).
BUILTIN_SUMMARIES = {
    SINGLE_TURN: "One generation per prompt, no environment turns (the default).",
    TOOL_CALLS: "The model may call the run's `tools`; each call's result comes back as a tool "
    "message and the model goes on, until it answers without a call or reaches max_turns.",
    GUESS_NUMBER: "A small multi-turn game for tests and demos: the model guesses a number "
    "between kwargs `low` and `high` (default 1 and 100) and the environment answers higher "
    "or lower as user turns.",
}
# Model turns when `max_turns` is not given.
DEFAULT_MAX_TURNS = {SINGLE_TURN: 1, TOOL_CALLS: 4, GUESS_NUMBER: 8}
USER_DEFAULT_MAX_TURNS = 4
MAX_TURNS = 64
MAX_TOTAL_TOKENS = 1 << 20  # far above any engine's max_model_len; the worker checks its own
MAX_TOOL_TIMEOUT_S = 60.0
MAX_TOOLS = 32
GUESS_KWARGS = ("low", "high")
MAX_GUESS_RANGE = 10**9

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Anchored with \A and \Z: `$` would also match before a trailing newline.
_USER_REF = re.compile(rf"\A{MODULE_PATTERN}:{_IDENT}\Z")
_ENTRY_POINT_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_.\-]{0,199}\Z")
_TOOL_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
ANY_CLASS = "*"
# `verifiers:<module>`: a `verifiers` environment module (its `load_environment(**kwargs)`),
# run by worker/environments/verifiers_env.py; allowed when the operator allows <module>.
VERIFIERS_PREFIX = "verifiers:"
_VERIFIERS_REF = re.compile(rf"\A{VERIFIERS_PREFIX}{MODULE_PATTERN}\Z")


def verifiers_module(name: str) -> str | None:
    """The module of a `verifiers:<module>` name, None for any other name."""
    return name[len(VERIFIERS_PREFIX) :] if _VERIFIERS_REF.match(name) else None


class EnvironmentNameError(ValueError):
    """An environment name that is neither a built-in, an entry-point name nor `module:Class`
    (`code`: snake_case, as the run's 422 reports it)."""

    def __init__(self, message: str, *, code: str = "config_rule") -> None:
        super().__init__(message)
        self.code = code


def check_name(name: str) -> None:
    """Raise EnvironmentNameError unless `name` could name an environment (nothing imported)."""
    if name in BUILTIN_ENVIRONMENTS:
        return
    try:
        check_name_length("environment", name)
    except RewardError as exc:
        raise EnvironmentNameError(str(exc), code=exc.code) from None
    vf_module = verifiers_module(name)
    if vf_module is not None or _USER_REF.match(name):
        module = vf_module or name.partition(":")[0]
        if module.split(".")[0] in sys.stdlib_module_names:
            raise EnvironmentNameError(
                f"environment {name!r}: module {module!r} is part of Python's standard library; "
                "an environment comes from a user module or entry point that the worker's "
                "operator allows"
            )
        return
    near = difflib.get_close_matches(name, BUILTIN_ENVIRONMENTS, n=1, cutoff=0.75)
    if _ENTRY_POINT_NAME.match(name) and not near:
        return
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise EnvironmentNameError(
        f"unknown environment {name!r}{hint}: use a built-in ({', '.join(BUILTIN_ENVIRONMENTS)}), "
        f"the name of an entry point in the group {ENTRY_POINT_GROUP!r}, 'module:Class' or "
        f"'{VERIFIERS_PREFIX}module'"
    )


def _check_name(name: str) -> str:
    try:
        check_name(name)
    except EnvironmentNameError as exc:
        raise PydanticCustomError(exc.code, str(exc)) from None
    return name


class EnvironmentConfig(_Strict):
    """The environment a run's trajectories come from, and its limits."""

    name: Annotated[str, AfterValidator(_check_name)] = Field(
        SINGLE_TURN,
        description="single_turn (default: one completion per prompt), tool_calls, guess_number "
        "(a multi-turn test game), an entry-point name of the group asyncgrpo.environments or "
        "'module:Class' of a module the worker's operator allows, or 'verifiers:module' (a "
        "verifiers environment module the worker's operator allows; needs the verifiers extra); "
        f"at most {MAX_NAME_CHARS} characters.",
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Tools the model may call (tool_calls: at least one of: calculator; "
        "single_turn and guess_number take none; user environments decide).",
    )
    max_turns: int | None = Field(
        None,
        description="Most model turns (generations) in one trajectory; None: the environment's "
        "default (single_turn 1, tool_calls 4, guess_number 8, user environments 4).",
    )
    max_total_tokens: int | None = Field(
        None,
        description="Most tokens in one trajectory, prompt, model turns and environment turns "
        "together; None: the engine's max_model_len. The worker refuses a value above its "
        "engine's max_model_len. Not for single_turn (bounded by sampling.max_new_tokens).",
    )
    tool_timeout_s: float = Field(
        5.0,
        description="Wall-clock limit of one tool call, in seconds; a tool that runs longer is "
        "killed and the trajectory ends with the stop reason tool_timeout.",
    )
    requires_trusted_worker: bool = Field(
        False,
        description="Lease only to workers an admin has marked trusted: for an environment "
        "whose rubric needs the answers on the worker.",
    )
    kwargs: Annotated[dict[str, Any], AfterValidator(free_json(16 * KIB))] = Field(
        default_factory=dict,
        description="Options for the environment (guess_number: low, high; user environments: "
        "their own; JSON of at most 16 KiB).",
    )

    RULES: ClassVar[dict[str, Rule]] = {
        "max_turns": (lambda n: 1 <= n <= MAX_TURNS, f"must be between 1 and {MAX_TURNS}"),
        "max_total_tokens": (
            lambda n: 2 <= n <= MAX_TOTAL_TOKENS,
            f"must be between 2 and {MAX_TOTAL_TOKENS:,}",
        ),
        "tool_timeout_s": (
            lambda t: 0 < t <= MAX_TOOL_TIMEOUT_S,
            f"must be above 0 and at most {MAX_TOOL_TIMEOUT_S:g}",
        ),
    }

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, tools: list[str], info: ValidationInfo) -> list[str]:
        if len(tools) > MAX_TOOLS:
            raise _fail(f"tools takes at most {MAX_TOOLS} names (got {len(tools)})")
        for tool in tools:
            if not _TOOL_NAME.match(tool):
                raise _fail(f"tools: {tool!r} is not a tool name (letters, digits, _; 1-64)")
        dupes = sorted({t for t in tools if tools.count(t) > 1})
        if dupes:
            raise _fail(f"tools names {', '.join(dupes)} more than once")
        return tools

    @model_validator(mode="after")
    def _fits_environment(self) -> EnvironmentConfig:
        if self.name == TOOL_CALLS:
            unknown = [t for t in self.tools if t not in BUILTIN_TOOLS]
            if not self.tools or unknown:
                got = f"unknown: {', '.join(unknown)}" if unknown else "got none"
                raise ValueError(
                    f"tools: tool_calls needs at least one built-in tool "
                    f"({', '.join(BUILTIN_TOOLS)}) ({got})"
                )
        elif self.name in BUILTIN_ENVIRONMENTS and self.tools:
            raise ValueError(f"tools: {self.name} calls no tools (got {self.tools})")
        if self.name == SINGLE_TURN and self.max_turns not in (None, 1):
            raise ValueError(
                f"max_turns: single_turn has exactly one model turn (got {self.max_turns})"
            )
        if self.name == SINGLE_TURN and self.max_total_tokens is not None:
            raise ValueError(
                "max_total_tokens: single_turn is bounded by sampling.max_new_tokens; its "
                f"workers keep the single-turn path, which has no token budget "
                f"(got {self.max_total_tokens})"
            )
        self._check_kwargs()
        return self

    def _check_kwargs(self) -> None:
        if self.name == GUESS_NUMBER:
            check_guess_kwargs(self.kwargs)
        elif self.name in BUILTIN_ENVIRONMENTS and self.kwargs:
            raise ValueError(f"kwargs: {self.name} takes no kwargs (got {sorted(self.kwargs)})")

    @property
    def turns(self) -> int:
        """`max_turns`, or the environment's default."""
        if self.max_turns is not None:
            return self.max_turns
        return DEFAULT_MAX_TURNS.get(self.name, USER_DEFAULT_MAX_TURNS)


def check_guess_kwargs(kwargs: Mapping[str, Any]) -> tuple[int, int]:
    """guess_number's (low, high), default (1, 100); ValueError naming the bad key."""
    unknown = sorted(set(kwargs) - set(GUESS_KWARGS))
    if unknown:
        raise ValueError(f"kwargs: guess_number takes only low, high (got {', '.join(unknown)})")
    low, high = kwargs.get("low", 1), kwargs.get("high", 100)
    for key, value in (("low", low), ("high", high)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"kwargs.{key} must be an integer (got {value!r})")
    if not low < high or high - low > MAX_GUESS_RANGE:
        raise ValueError(
            f"kwargs: guess_number needs low < high and at most {MAX_GUESS_RANGE:,} apart "
            f"(got low={low}, high={high})"
        )
    return low, high


@dataclass(frozen=True)
class EnvironmentAllowlist:
    """The user environments a worker may load, as its operator configured them: modules
    (`ASYNCGRPO_WORKER_ENVIRONMENT_MODULES`: their `module:Class` names load) and installed
    entry points of the group `asyncgrpo.environments` (name → `module:attr`). Built-ins are
    always allowed."""

    modules: frozenset[str] = frozenset()
    entry_points: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def discover(cls, modules: Iterable[str] = ()) -> EnvironmentAllowlist:
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        return cls(frozenset(modules), {ep.name: ep.value for ep in found})

    def names(self) -> list[str]:
        """What a worker can run, as it would declare it: built-ins, entry-point names and
        `module:*` for each allowed module."""
        modules = [f"{m}:{ANY_CLASS}" for m in sorted(self.modules)]
        return list(BUILTIN_ENVIRONMENTS) + sorted(self.entry_points) + modules

    def allows(self, name: str) -> bool:
        vf_module = verifiers_module(name)
        if vf_module is not None:
            return vf_module in self.modules
        module = name.partition(":")[0]
        return (
            name in BUILTIN_ENVIRONMENTS
            or name in self.entry_points
            or (bool(_USER_REF.match(name)) and module in self.modules)
        )


BUILTINS_ONLY = EnvironmentAllowlist()


def declared_allows(declared: Iterable[str], name: str) -> bool:
    """Whether a worker that declared `declared` (EnvironmentAllowlist.names()) can run the
    environment `name`: named as such, or `module:Class` of a module it declared `module:*`."""
    names = set(declared)
    if name in names:
        return True
    vf_module = verifiers_module(name)
    if vf_module is not None:
        return f"{vf_module}:{ANY_CLASS}" in names
    module = name.partition(":")[0]
    return bool(_USER_REF.match(name)) and f"{module}:{ANY_CLASS}" in names


def worker_can_run(env: EnvironmentConfig, declared: Iterable[str], trusted: bool) -> bool:
    """The grant rule: the worker declared the run's environment, and is trusted when the
    environment requires it."""
    return declared_allows(declared, env.name) and (trusted or not env.requires_trusted_worker)
