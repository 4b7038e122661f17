"""A tool sandbox shared by the environment tests (its children start once per module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from worker.environments.sandbox import ToolSandbox


@pytest.fixture(scope="module")
def sandbox() -> Iterator[ToolSandbox]:
    with ToolSandbox(memory_mb=256) as box:
        yield box
