"""The import rule (docs/architecture/index.md, "Processes and imports"), checked over every
module's imports, including those inside functions: a GPU box installs no web stack, and the wire
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


# The feature order (docs/architecture/index.md, "Feature order"), lowest
# first: a unit of server/ (a feature folder, or a module directly under server/) imports only
# units before it. Checked over every import, function-level ones included.
FEATURE_ORDER = [
    # platform: knows no feature
    "config",
    "errors",
    "db_types",
    "db",
    "db_async",
    "routing",
    "wakeups",
    "long_poll",
    "limits",
    "security_headers",
    "storage_factory",
    "wake",
    "request_deps",
    # features, and the platform modules that need some
    "models",
    "idempotency",
    "installation",
    "bucket",
    "audit",
    "tokens",
    "projects",
    "workers",
    "deps",
    "events",
    "datasets",
    "runs",
    "sweeps",
    "leases",
    "evals",
    "versions",
    "learner",
    "learners",
    "wiring",
    "adapters",
    "blobs",
    "doctor",
    "jobs",
    "metrics",
    "dashboard",
    "health",
    "api_docs",
    "migrate",
    "app",
    "main",
]

# Edges inside server/leases/ and server/evals/ that break the order today: removed by the
# lease-engine change (those folders are being rewritten). The list may only shrink: an edge
# listed here that no longer exists fails the test too.


def _unit(rel: tuple[str, ...]) -> str:
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def server_imports(path: Path, rel: tuple[str, ...]) -> set[str]:
    """The server units this module (at `rel` inside server/) imports: `import server.x`,
    `from server.x import y`, `from server import x` and relative imports, anywhere in it."""
    names: set[str] = set()
    package = ("server", *rel[:-1])
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            base += node.module.split(".") if node.module else []
            modules = [base + [alias.name] for alias in node.names] if len(base) == 1 else [base]
        else:
            continue
        names |= {m[1] for m in modules if len(m) > 1 and m[0] == "server"}
    return names


def unit_edges(root: Path) -> dict[tuple[str, str], list[str]]:
    """(importer, imported) between different units of the `server` tree at `root`, with the
    modules that make each edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted((root / "server").rglob("*.py")):
        rel = path.relative_to(root / "server").parts
        unit = _unit(rel)
        for target in server_imports(path, rel) - {unit}:
            edges.setdefault((unit, target), []).append("/".join(rel))
    return edges


def order_violations(
    edges: dict[tuple[str, str], list[str]], order: list[str]
) -> dict[tuple[str, str], list[str]]:
    rank = {unit: i for i, unit in enumerate(order)}
    return {
        (a, b): modules
        for (a, b), modules in edges.items()
        if rank.get(a, -1) <= rank.get(b, len(order))
    }


def test_every_server_unit_is_in_the_order() -> None:
    units = {_unit(p.relative_to(ROOT / "server").parts) for p in (ROOT / "server").rglob("*.py")}
    assert units - {"__init__"} == set(FEATURE_ORDER)


def test_server_features_import_only_features_below_them() -> None:
    violations = order_violations(unit_edges(ROOT), FEATURE_ORDER)
    assert violations == {}


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "server" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_order_check_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "a/__init__.py": "",
            "a/m.py": "def f():\n    from server.b import x\n",
            "a/n.py": "from ..c import y\nfrom server import d\nimport server.e.z\n",
        },
    )
    assert set(unit_edges(root)) == {("a", "b"), ("a", "c"), ("a", "d"), ("a", "e")}
    assert set(order_violations(unit_edges(root), ["b", "c", "d", "e", "a"])) == set()
    assert set(order_violations(unit_edges(root), ["a", "b", "c", "d", "e"])) == {
        ("a", "b"),
        ("a", "c"),
        ("a", "d"),
        ("a", "e"),
    }


def test_the_order_check_fails_a_cycle(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"a/m.py": "from server.b import x\n", "b/m.py": "def f():\n    from server.a import y\n"},
    )
    for order in (["a", "b"], ["b", "a"]):
        assert order_violations(unit_edges(root), order) != {}
