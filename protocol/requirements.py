"""This asyncgrpo's release and what it requires of the packages beside it, from the one home
of both: pyproject.toml (`[project]` version, dependencies and extras). A source checkout reads
its pyproject.toml (an editable install's metadata keeps the values of its install); an
installed wheel reads its own metadata, which is that file's at build time."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from functools import cache
from pathlib import Path

DISTRIBUTION = "asyncgrpo"
_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
_NAME = re.compile(r"\A\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@cache
def _checkout_project() -> dict[str, object] | None:
    """The `[project]` table of the checkout this module runs from, if it runs from one."""
    try:
        project = tomllib.loads(_PYPROJECT.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None
    return project if project.get("name") == DISTRIBUTION else None


def release() -> str:
    """This asyncgrpo's version ("unknown" when neither a checkout nor an install says)."""
    project = _checkout_project()
    if project is not None:
        return str(project["version"])
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _requirement_strings() -> list[str]:
    project = _checkout_project()
    if project is not None:
        extras = project.get("optional-dependencies", {})
        assert isinstance(extras, dict)
        found = list(project.get("dependencies", []))  # type: ignore[call-overload]
        return found + [r for group in extras.values() for r in group]
    try:
        return list(importlib.metadata.requires(DISTRIBUTION) or [])
    except importlib.metadata.PackageNotFoundError:
        return []


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement(package: str) -> str | None:
    """asyncgrpo's requirement on `package` as written, markers dropped (e.g. "torch==2.13.0"),
    or None when it declares none."""
    for text in _requirement_strings():
        match = _NAME.match(text)
        if match and _normal(match[1]) == _normal(package):
            return text.split(";", 1)[0].strip()
    return None
