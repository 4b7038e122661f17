"""The import rule (docs/architecture.md, "Processes and imports"), checked over every module's
imports, including those inside functions: a GPU box installs no web stack, and the wire
contract stays free of torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "worker": {"server", "learner"},
    "learner": {"server", "worker"},
    "protocol": {"server", "worker", "learner", "lm", "torch"},
    "lm": {"server", "worker", "learner"},
    "server": {"worker", "learner", "lm", "torch"},
}


def imported_top_levels(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_it_may(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {p: names for p, names in offenders.items() if names} == {}


def test_the_check_sees_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from server.db import x\n    import torch.nn\n")
    assert imported_top_levels(module) == {"server", "torch"}
