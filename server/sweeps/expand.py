"""A sweep's combinations (docs/guides/sweeps.md, "The request"): field paths checked against
the run config's fields, a grid expanded (or a list of overrides taken as given), each
combination applied to the base config and validated as a RunConfig, all before any run is
made. Pure: no database."""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import math
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from protocol.error_codes import ErrorCode
from protocol.run_config import RunConfig
from protocol.schemas import MAX_JSON_DEPTH
from server.errors import Unprocessable

MAX_NAME = 200  # RunConfig's name rule
Overrides = dict[str, Any]


def _members(annotation: Any) -> list[Any]:
    """The types a field may hold: Optional and unions unwrapped, Annotated stripped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for a in get_args(annotation) if a is not type(None) for m in _members(a)]
    return [annotation]


def _inside(annotation: Any, segment: str) -> list[Any]:
    """The types at `segment` inside a value of `annotation` (none: no such field)."""
    found: list[Any] = []
    for member in _members(annotation):
        origin = get_origin(member)
        if member is Any:
            found.append(Any)
        elif isinstance(member, type) and issubclass(member, BaseModel):
            field = member.model_fields.get(segment)
            if field is not None:
                found.append(field.annotation)
        elif origin in (list, tuple, Sequence) and segment.isdigit():
            found.append((get_args(member) or (Any,))[0])
        elif origin in (dict, Mapping):
            found.append((get_args(member) or (Any, Any))[-1])
    return found


def _fields_of(annotations: list[Any]) -> list[str]:
    names: list[str] = []
    for annotation in annotations:
        for member in _members(annotation):
            if isinstance(member, type) and issubclass(member, BaseModel):
                names += [n for n in member.model_fields if n not in names]
    return names


def check_path(path: str, where: str) -> list[str]:
    """The path's segments; 422 `sweep_path_unknown` (at `where`) when it names no field of
    the run config. `name` is not a path: a sweep's runs are named after their overrides."""
    segments = path.split(".")
    if len(segments) > MAX_JSON_DEPTH:
        raise Unprocessable(
            f"{where}: a path of {len(segments)} parts; a run config nests at most "
            f"{MAX_JSON_DEPTH}",
            field=where,
            code=ErrorCode.sweep_path_unknown,
        )
    if path == "name":
        raise Unprocessable(
            f"{where}: the runs' names are made from the sweep's name and their overrides; "
            "`name` cannot be swept",
            field=where,
            code=ErrorCode.sweep_path_unknown,
        )
    current: list[Any] = [RunConfig]
    for depth, segment in enumerate(segments):
        inner = [t for a in current for t in _inside(a, segment)] if segment else []
        if not inner:
            parent = ".".join(segments[:depth]) or "the run config"
            known = _fields_of(current)
            close = difflib.get_close_matches(segment, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            listed = f" (its fields: {', '.join(known)})" if known and not close else ""
            raise Unprocessable(
                f"{where}: {path!r} names no run config field: {parent} has no "
                f"{segment!r}{hint}{listed}",
                field=where,
                code=ErrorCode.sweep_path_unknown,
            )
        current = inner
    return segments


def _check_paths(paths: Sequence[str], where: str) -> None:
    for path in paths:
        check_path(path, f"{where}.{path}")
    ordered = sorted(paths)
    for a, b in itertools.pairwise(ordered):
        if b.startswith(a + "."):
            raise Unprocessable(
                f"{where}.{b}: {b!r} lies inside {a!r}, which is swept too: sweep one of them",
                field=f"{where}.{b}",
                code=ErrorCode.sweep_invalid,
            )


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def combinations(
    grid: Mapping[str, Any] | None, overrides: Sequence[Any] | None, max_runs: int
) -> list[Overrides]:
    """Every combination ({path: value}) in order: a grid's product with its last path varying
    fastest, or the overrides as listed. 422 `sweep_invalid` for malformed input,
    `sweep_path_unknown` for a path that names no field, `sweep_too_large` past `max_runs`."""
    if (grid is None) == (overrides is None):
        raise Unprocessable(
            "give exactly one of `grid` (field path -> list of values) or `overrides` (a list "
            "of {field path: value})",
            field="grid" if grid is not None else "body",
            code=ErrorCode.sweep_invalid,
        )
    if grid is not None:
        return _grid(grid, max_runs)
    assert overrides is not None
    return _listed(overrides, max_runs)


def _too_large(count: int | str, max_runs: int, field: str) -> Unprocessable:
    return Unprocessable(
        f"the sweep would create {count} runs; at most {max_runs} (sweeps.max_runs, "
        "ASYNCGRPO_SWEEPS__MAX_RUNS)",
        field=field,
        code=ErrorCode.sweep_too_large,
        max_runs=max_runs,
    )


def _grid(grid: Mapping[str, Any], max_runs: int) -> list[Overrides]:
    if not grid:
        raise Unprocessable(
            "the grid is empty: name at least one field path with a list of values",
            field="grid",
            code=ErrorCode.sweep_invalid,
        )
    _check_paths(list(grid), "grid")
    count = 1
    for path, values in grid.items():
        where = f"grid.{path}"
        if not isinstance(values, list):
            raise Unprocessable(
                f"{where}: a grid value is a list of the values to try (got "
                f"{type(values).__name__} {_shown(values)})",
                field=where,
                code=ErrorCode.sweep_invalid,
            )
        if not values:
            raise Unprocessable(
                f"{where}: the list of values is empty",
                field=where,
                code=ErrorCode.sweep_invalid,
            )
        seen: set[str] = set()
        for value in values:
            key = _canonical(value)
            if key in seen:
                raise Unprocessable(
                    f"{where}: lists {_shown(value)} twice (each combination is made once)",
                    field=where,
                    code=ErrorCode.sweep_invalid,
                )
            seen.add(key)
        count *= len(values)
        if count > max_runs:  # before the product is expanded, however large it would be
            total = math.prod(len(v) if isinstance(v, list) else 1 for v in grid.values())
            raise _too_large(total, max_runs, "grid")
    paths = list(grid)
    return [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*grid.values())]


def _listed(overrides: Sequence[Any], max_runs: int) -> list[Overrides]:
    if not overrides:
        raise Unprocessable(
            "the list of overrides is empty", field="overrides", code=ErrorCode.sweep_invalid
        )
    if len(overrides) > max_runs:
        raise _too_large(len(overrides), max_runs, "overrides")
    seen: dict[str, int] = {}
    out: list[Overrides] = []
    for i, item in enumerate(overrides):
        where = f"overrides.{i}"
        if not isinstance(item, dict):
            raise Unprocessable(
                f"{where}: each override is an object of field path -> value (got "
                f"{type(item).__name__})",
                field=where,
                code=ErrorCode.sweep_invalid,
            )
        _check_paths(list(item), where)
        key = _canonical(item)
        if key in seen:
            raise Unprocessable(
                f"{where} is the same as overrides.{seen[key]} (each combination is made once)",
                field=where,
                code=ErrorCode.sweep_invalid,
            )
        seen[key] = i
        out.append(dict(item))
    return out


def _shown(value: Any) -> str:
    """A value as a run's name and a message show it: strings bare, the rest as JSON."""
    text = value if isinstance(value, str) else _canonical(value)
    return text if len(text) <= 60 else text[:59] + "…"


def label(overrides: Overrides) -> str:
    """`grpo.learning_rate=1e-05 lora.rank=8` (the base itself: `(base)`)."""
    return " ".join(f"{path}={_shown(v)}" for path, v in overrides.items()) or "(base)"


def run_name(sweep_name: str, overrides: Overrides) -> str:
    """The run's name: the sweep's, then its overrides, within the 200 characters of a name."""
    name = f"{sweep_name} {label(overrides)}"
    return name if len(name) <= MAX_NAME else name[: MAX_NAME - 1] + "…"


def applied(base: Mapping[str, Any], overrides: Overrides) -> dict[str, Any]:
    """A copy of the base config with each path set to its value (missing objects made)."""
    config = copy.deepcopy(dict(base))
    for path, value in overrides.items():
        node: Any = config
        segments = path.split(".")
        for segment in segments[:-1]:
            if isinstance(node, list):
                index = int(segment)
                if index >= len(node):
                    raise IndexError(segment)
                child = node[index]
                if not isinstance(child, dict | list):
                    child = node[index] = {}
            else:
                child = node.get(segment)
                if not isinstance(child, dict | list):
                    child = node[segment] = {}
            node = child
        last = segments[-1]
        if isinstance(node, list):
            index = int(last)
            if index >= len(node):
                raise IndexError(last)
            node[index] = copy.deepcopy(value)
        else:
            node[last] = copy.deepcopy(value)
    return config


def validated(
    sweep_name: str, base: Mapping[str, Any], combos: list[Overrides], source: str
) -> list[RunConfig]:
    """Each combination's run config, validated; 422 `sweep_combination_invalid` naming the
    first combination that fails (its index, overrides, field and every error), and
    `sweep_invalid` when two combinations make the same config (`source`: grid or overrides,
    where the sweep's combinations came from)."""
    configs: list[RunConfig] = []
    made: dict[str, int] = {}
    for index, overrides in enumerate(combos):
        try:
            raw = applied(base, overrides)
        except (IndexError, ValueError) as exc:
            path = next(iter(overrides), "")
            raise combination_refused(
                index, overrides, path, f"the base config's list has no item {exc}", []
            ) from None
        raw["name"] = run_name(sweep_name, overrides)
        try:
            config = RunConfig.model_validate(raw)
        except ValidationError as exc:
            errors = [
                {
                    "field": ".".join(str(p) for p in err.get("loc", ())),
                    "message": err.get("msg", ""),
                    "type": err.get("type", ""),
                }
                for err in exc.errors()
            ]
            first = errors[0] if errors else {"field": "", "message": str(exc)}
            raise combination_refused(
                index, overrides, first["field"], first["message"], errors
            ) from None
        key = _canonical({**config.model_dump(mode="json"), "name": None})
        if key in made:
            raise Unprocessable(
                f"combinations {made[key]} ({label(combos[made[key]])}) and {index} "
                f"({label(overrides)}) make the same run config",
                field=f"overrides.{index}" if source == "overrides" else "grid",
                code=ErrorCode.sweep_invalid,
                combination=index,
            )
        made[key] = index
        configs.append(config)
    return configs


def combination_refused(
    index: int,
    overrides: Overrides,
    field: str,
    message: str,
    errors: list[dict[str, str]],
    code: ErrorCode | None = None,
) -> Unprocessable:
    """The 422 that names the combination (its index and overrides) and the field; its code
    `sweep_combination_invalid`, or the refusal's own (`code`) when a run's creation refused
    it after validation (a stored dataset that does not exist, a refused webhook URL)."""
    at = f"{field}: " if field else ""
    return Unprocessable(
        f"combination {index} ({label(overrides)}) is not a valid run config: {at}{message}; "
        "no run was created",
        field=field,
        code=code or ErrorCode.sweep_combination_invalid,
        combination=index,
        overrides=overrides,
        errors=errors,
    )
