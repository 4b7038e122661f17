"""A pydantic field as the reference shows it: its type, default and constraints, read from the
model (annotation, `FieldInfo`, its metadata), never written by hand."""

from __future__ import annotations

import enum
import json
import re
import types
import uuid
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic.fields import FieldInfo

from asyncgrpo.docs_reference.markdown import code, value

_SECRET_NAME = re.compile(r"(secret|password|(^|_)token$|api_key$)")
_TEXT_TYPES = (str, SecretStr, SecretBytes, bytes)
_NAMES = {type(None): "None", Path: "path", PurePath: "path", uuid.UUID: "UUID", Any: "any"}
_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "≤"),
    (annotated_types.MultipleOf, "multiple_of", "multiple of"),
    (annotated_types.MinLen, "min_length", "length ≥"),
    (annotated_types.MaxLen, "max_length", "length ≤"),
)


def type_label(annotation: Any, *, literals: bool = True) -> str:
    """`str | None`, `list[str]`, a model's class name; a Literal as its values (`"a" | "b"`),
    or with `literals=False` as their type (`str`, the values being listed apart)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return type_label(get_args(annotation)[0], literals=literals)
    if origin in (Union, types.UnionType):
        return " | ".join(type_label(a, literals=literals) for a in get_args(annotation))
    if origin is Literal:
        if not literals:
            return " | ".join(dict.fromkeys(type(v).__name__ for v in get_args(annotation)))
        return " | ".join(json.dumps(v) for v in get_args(annotation))
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        inner = ", ".join(type_label(a, literals=literals) for a in get_args(annotation))
        return f"{name}[{inner}]"
    if annotation in _NAMES:
        return _NAMES[annotation]
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def is_secret(name: str, field: FieldInfo) -> bool:
    """A field holding a secret: a Secret type, or text whose name says so (…_token,
    secret_…; `print_admin_token`, a bool, is none)."""
    kinds = (field.annotation, *get_args(field.annotation))
    if any(k in (SecretStr, SecretBytes) for k in kinds):
        return True
    return any(k in _TEXT_TYPES for k in kinds) and bool(_SECRET_NAME.search(name))


def shown_default(field: FieldInfo) -> str | None:
    """The default as its field describes it (`json_schema_extra={"shown_default": …}`), for a
    default computed from other settings or from the machine."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    shown = extra.get("shown_default")
    return shown if isinstance(shown, str) else None


def default_label(name: str, field: FieldInfo, *, none: str = "null") -> str:
    """The default as a table cell: `required`, the value as code (JSON; None as `none`), or
    `(secret)`."""
    if field.is_required():
        return "required"
    shown = shown_default(field)
    if shown is not None:
        return code(shown)
    default = field.get_default(call_default_factory=True)
    if default is not None and is_secret(name, field):
        return "(secret)"
    if isinstance(default, BaseModel):
        return "its fields' defaults"
    if default is None:
        return code(none)
    label = value(plain(default))
    home = str(Path.home())
    if home != "/" and home in label:
        raise ValueError(
            f"{name}: the default {label} depends on the machine; give the field "
            'json_schema_extra={"shown_default": …} saying what it is'
        )
    return label


def plain(obj: Any) -> Any:
    """A default as JSON shows it (paths and UUIDs as strings, enums as their values)."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, PurePath | uuid.UUID):
        return str(obj)
    if isinstance(obj, list | tuple):
        return [plain(o) for o in obj]
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    return obj


def bounds(field: FieldInfo) -> list[str]:
    """The field's numeric and length constraints (ge, le, …) as `≥ 1`, `≤ 1000`."""
    found = []
    for item in field.metadata:
        for kind, attribute, symbol in _BOUNDS:
            if isinstance(item, kind):
                found.append(f"{symbol} {getattr(item, attribute)}")
    return found


def choices(annotation: Any) -> list[Any]:
    """The values a Literal (or an optional Literal) allows; empty for any other type."""
    origin = get_origin(annotation)
    if origin is Literal:
        return list(get_args(annotation))
    if origin in (Union, types.UnionType, Annotated):
        return [c for a in get_args(annotation) for c in choices(a)]
    return []
