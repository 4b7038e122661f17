"""scripts/install.sh compiles the environment and this checkout to bytecode
(docs/guides/installing.md, "Bytecode, compiled at install"): where PYTHONDONTWRITEBYTECODE is
set, a module without its `.pyc` is compiled again by every process that imports it."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

# What every server, worker and learner process imports at its start.
MODULES = ("torch", "transformers", "sqlalchemy", "fastapi", "server.app", "worker.main")


@pytest.mark.parametrize("name", MODULES)
def test_the_installed_modules_have_their_bytecode(name: str) -> None:
    module = importlib.import_module(name)
    source = module.__file__
    assert source is not None and source.endswith(".py"), source
    cached = Path(importlib.util.cache_from_source(source))
    assert cached.is_file(), f"{name}: no {cached} (run scripts/install.sh)"
