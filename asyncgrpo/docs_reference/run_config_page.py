"""docs/reference/run-config.md: the run configuration (protocol/run_config.py `RunConfig`), each
block and field with its type, default, constraints (ge/le, Literal choices, the model's RULES)
and description; a discriminated union (the dataset kinds) listed per variant; the built-in
rewards and environments a block may name."""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from asyncgrpo.docs_reference.fields import bounds, choices, default_label, type_label
from asyncgrpo.docs_reference.markdown import cell, code, first_paragraph, page, table, value

HEADERS = ("Field", "Type", "Default", "Constraints", "Description")


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds: itself, in an Optional, a list or a union, in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = get_origin(annotation)
    if origin is Annotated:
        return models_in(get_args(annotation)[0])
    if origin in (Union, types.UnionType, list, tuple):
        return [m for a in get_args(annotation) for m in models_in(a)]
    return []


def discriminator(models: list[type[BaseModel]]) -> str | None:
    """The field whose Literal value tells the union's variants apart (`kind`)."""
    shared = set.intersection(*(set(m.model_fields) for m in models))
    for name in sorted(shared):
        if all(len(choices(m.model_fields[name].annotation)) == 1 for m in models):
            return name
    return None


def constraints(model: type[BaseModel], name: str, info: FieldInfo) -> str:
    """ge/le bounds, a Literal's choices and the model's own rule for the field."""
    parts = bounds(info)
    allowed = choices(info.annotation)
    if len(allowed) > 1:
        parts.append("one of " + ", ".join(value(c) for c in allowed))
    elif allowed:
        parts.append(f"must be {value(allowed[0])}")
    rules = getattr(model, "RULES", {})
    if name in rules:
        parts.append(cell(rules[name][1]))
    return "; ".join(parts) or "—"


def field_row(model: type[BaseModel], name: str, info: FieldInfo) -> tuple[str, ...]:
    return (
        code(name),
        cell(type_label(info.annotation, literals=False)),
        default_label(name, info),
        constraints(model, name, info),
        cell(info.description),
    )


@dataclass
class Block:
    """A model (or a union of models) and the paths of the config where it appears."""

    models: list[type[BaseModel]]
    paths: list[str] = field(default_factory=list)


def blocks(root: type[BaseModel]) -> list[Block]:
    """Every block under `root`, breadth first in declaration order; a model or union met again
    at another path (the eval dataset) is one block with both paths."""
    found: dict[tuple[type[BaseModel], ...], Block] = {}
    todo: list[tuple[str, type[BaseModel]]] = [("", root)]
    while todo:
        path, model = todo.pop(0)
        for name, info in model.model_fields.items():
            held = models_in(info.annotation)
            if not held:
                continue
            sub = f"{path}.{name}" if path else name
            if get_origin(info.annotation) is list:
                sub += "[]"
            key = tuple(held)
            if key not in found:
                found[key] = Block(held)
                todo += [(sub, m) for m in held]
            found[key].paths.append(sub)
    return list(found.values())


def model_table(model: type[BaseModel], first: str | None = None) -> str:
    """The model's fields (`first`, the union's discriminator, before the others)."""
    names = sorted(model.model_fields, key=lambda n: n != first)
    return table(HEADERS, [field_row(model, n, model.model_fields[n]) for n in names])


def block_section(block: Block) -> Iterator[str]:
    where = ", ".join(code(p) for p in block.paths)
    if len(block.models) == 1:
        (model,) = block.models
        yield f"## {where}\n\n{cell(first_paragraph(model.__doc__))} ({code(model.__name__)})\n"
        yield model_table(model)
        return
    tag = discriminator(block.models)
    assert tag is not None, f"{where}: a union of models without a discriminator"
    yield f"## {where}\n\nOne of these, chosen by {code(tag)}:\n"
    for model in block.models:
        (kind,) = choices(model.model_fields[tag].annotation)
        about = cell(first_paragraph(model.__doc__))
        yield f"### {code(tag)}: {value(kind)}\n\n{about} ({code(model.__name__)})\n"
        yield model_table(model, first=tag)


def _columns(name: str) -> str:
    from protocol.rewards import columns_read

    read = columns_read(name, {})
    if read is None:
        return "its template's"
    return ", ".join(code(c) for c in sorted(read)) or "none"


def rewards_section() -> str:
    """The built-in rewards (protocol/rewards.py BUILTINS) and their keyword arguments."""
    from protocol.rewards import BUILTINS, KWARG_MODELS

    rows = []
    for name in sorted(BUILTINS):
        kwargs = [
            f"{code(k)}: {cell(type_label(f.annotation, literals=False))}"
            + "".join(f" {b}" for b in bounds(f))
            + f" = {default_label(k, f)}"
            for k, f in KWARG_MODELS[name].model_fields.items()
        ]
        about = cell(first_paragraph(BUILTINS[name].__doc__))
        rows.append((code(name), about, _columns(name), "; ".join(kwargs) or "none"))
    intro = (
        "### Built-in rewards\n\nA reward's `name` is one of these, an entry-point name of the "
        "group `asyncgrpo.rewards` or `module:function` of a module the learner's operator "
        "allows; `kwargs` are the function's keyword arguments.\n"
    )
    headers = ("Name", "Score", "Reference columns read", "kwargs (type = default)")
    return intro + "\n" + table(headers, rows)


def environments_section() -> str:
    """The built-in environments (protocol/environments.py)."""
    from protocol.environments import BUILTIN_ENVIRONMENTS, BUILTIN_SUMMARIES, DEFAULT_MAX_TURNS

    rows = [
        (code(n), cell(BUILTIN_SUMMARIES[n]), value(DEFAULT_MAX_TURNS[n]))
        for n in BUILTIN_ENVIRONMENTS
    ]
    intro = (
        "### Built-in environments\n\n`environment.name` is one of these, an entry-point name "
        "of the group `asyncgrpo.environments`, `module:Class` or `verifiers:module` of a "
        "module the worker's operator allows.\n"
    )
    return intro + "\n" + table(("Name", "What it does", "Default max_turns"), rows)


# Sections appended after the block of that path.
_EXTRAS = {"rewards[]": rewards_section, "environment": environments_section}

INTRO = """
The body of `POST /api/v1/runs` (and of the dashboard's *New run* form): one JSON object,
checked at creation, read from `protocol/run_config.py`. Unknown fields are refused at every
level; a refused value is answered 422 with the field's path and the rule it broke. Fields
without a default are required. See `examples/runs/` for complete configurations.
"""


def render() -> str:
    from protocol.run_config import RunConfig

    sections = [f"## Top level\n\n{cell(first_paragraph(RunConfig.__doc__))}\n"]
    sections.append(model_table(RunConfig))
    for block in blocks(RunConfig):
        sections += block_section(block)
        sections += [extra() for p in block.paths if (extra := _EXTRAS.get(p))]
    return page("Run configuration", INTRO, sections)


def undescribed(root: type[BaseModel]) -> list[str]:
    """Fields of `root` and of every block under it with no description: `LoraConfig.rank`."""
    models = [root, *(m for b in blocks(root) for m in b.models)]
    return [
        f"{m.__name__}.{n}"
        for m in models
        for n, i in m.model_fields.items()
        if not (i.description or "").strip()
    ]


def missing_descriptions() -> list[str]:
    from protocol.run_config import RunConfig

    return undescribed(RunConfig)
