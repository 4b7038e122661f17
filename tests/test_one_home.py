"""One home per rule (docs/architecture.md, "Processes and imports": one home per rule), checked
over the source: the constants and helpers that were once written several times (and had
drifted apart) are defined once. The run lifecycle's and the admission counter's single writers
are checked in tests/server/runs/test_lifecycle.py."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "protocol", "worker", "learner", "lm", "asyncgrpo", "bench")


def _modules() -> Iterator[tuple[str, ast.AST]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def _string_collections(tree: ast.AST) -> Iterator[set[str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            yield {e.value for e in node.elts if isinstance(e, ast.Constant)} - {None}


def test_terminal_statuses_are_written_once() -> None:
    """Three different TERMINAL tuples once disagreed (one counted budget_exhausted)."""
    homes = {
        module
        for module, tree in _modules()
        for strings in _string_collections(tree)
        if {"completed", "cancelled"} <= strings
    }
    assert homes == {"protocol/schemas.py"}


def _hashes_a_file_it_reads(node: ast.FunctionDef) -> bool:
    source = ast.unparse(node)
    return "hashlib.sha256" in source and ('"rb"' in source or "'rb'" in source)


def test_one_file_hash_helper() -> None:
    """Three file-hash helpers, two with the same name and different return types, were one
    too many: protocol.storage.sha256_file is the only function that hashes a file it reads."""
    helpers = {
        f"{module}:{node.name}"
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and _hashes_a_file_it_reads(node)
    }
    assert helpers == {"protocol/storage.py:sha256_file"}


def test_events_are_inserted_in_one_place() -> None:
    """Every event goes through server/events (so each alarm reaches the run's webhook): a
    quarantine event inserted elsewhere once never did."""
    inserters = {
        module
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "Event"
    }
    assert inserters == {"server/events/repository.py"}
