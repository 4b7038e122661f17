"""The lease router is HTTP only: the one lease engine (server/leases/service.py, fenced.py) and
the SQL that differs between the databases (statements.py) live in the lease package; the
router hands each call to the engine in one thread-pool hop (units.in_thread) and imports no
database library."""

from __future__ import annotations

import ast
import inspect
import types

from server.leases import router

DRIVERS = ("psycopg", "psycopg_pool", "sqlalchemy", "sqlite3")


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


def test_the_router_imports_no_database_library() -> None:
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
