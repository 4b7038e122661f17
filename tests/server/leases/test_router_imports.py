"""The lease router is HTTP only: which path answers a call, and the database driver that the
event-loop path needs, live in the lease package (server/leases/paths.py)."""

from __future__ import annotations

import ast
import inspect
import types

from server.leases import router

DRIVERS = ("psycopg", "psycopg_pool")


def _imported_modules(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def _is_driver(module_name: str) -> bool:
    return module_name.split(".")[0] in DRIVERS


def test_the_router_imports_no_database_driver() -> None:
    imported = _imported_modules(inspect.getsource(router))
    assert "fastapi" in imported  # the parse found the router's imports
    assert not {name for name in imported if _is_driver(name)}
    driver_globals = {
        name
        for name, value in vars(router).items()
        if _is_driver(getattr(value, "__module__", None) or "")
        or (isinstance(value, types.ModuleType) and _is_driver(value.__name__))
    }
    assert not driver_globals
