"""This asyncgrpo's release and its requirements come from pyproject.toml, the one home of both
(protocol/requirements.py): the doctor and the server's version read them there."""

from __future__ import annotations

import tomllib
from pathlib import Path

from protocol import requirements

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())


def test_the_release_is_pyproject_s_version() -> None:
    assert requirements.release() == PYPROJECT["project"]["version"]


def test_each_requirement_is_pyproject_s_as_written_in_any_extra() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    declared = [*PYPROJECT["project"]["dependencies"], *(r for g in extras.values() for r in g)]
    torch = next(r for r in declared if r.startswith("torch"))
    assert requirements.requirement("torch") == torch
    assert requirements.requirement("vllm") in extras["vllm"]
    settings = next(r for r in declared if r.startswith("pydantic-settings"))
    assert requirements.requirement("Pydantic_Settings") == settings  # names compare normalised
    assert requirements.requirement("no-such-package") is None
