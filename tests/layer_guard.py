"""The `unit` layer's guard (docs/guides/testing-layers.md): while a unit test runs, the entry
points that open a socket, a database connection or a process fail it, naming what it opened.

Threads alive before the test (a session's moto or uvicorn server) are left alone: the guard
is for what the test itself does. A violation in a thread the test started fails it at
teardown, since an exception there would only end that thread."""

from __future__ import annotations

import inspect
import multiprocessing.process
import os
import socket
import sqlite3
import sqlite3.dbapi2
import subprocess
import threading
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any

import pytest
from sqlalchemy.engine import Engine

SOCKET = "opened a socket"
DATABASE = "opened a database connection"
SUBPROCESS = "started a subprocess"


def _entry_points() -> list[tuple[object, str, str]]:
    """(owner, attribute, what calling it does)."""
    points: list[tuple[object, str, str]] = [
        (socket.socket, "connect", SOCKET),
        (socket.socket, "connect_ex", SOCKET),
        (socket.socket, "bind", SOCKET),
        (sqlite3, "connect", DATABASE),
        (sqlite3.dbapi2, "connect", DATABASE),
        (Engine, "connect", DATABASE),
        (Engine, "raw_connection", DATABASE),
        (subprocess.Popen, "_execute_child", SUBPROCESS),
        (multiprocessing.process.BaseProcess, "start", SUBPROCESS),
    ]
    points += [
        (os, name, SUBPROCESS)
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
        if hasattr(os, name)
    ]
    if find_spec("psycopg") is not None:
        import psycopg

        points += [(psycopg, "connect", DATABASE), (psycopg.Connection, "connect", DATABASE)]
    return points


def violation_message(what: str, call: str) -> str:
    return (
        f"unit test {what}: mark it integration or use a fixture that says so ({call}; "
        "docs/guides/testing-layers.md)"
    )


class UnitGuard:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch
        self._test_thread = threading.get_ident()
        self._exempt = {t.ident for t in threading.enumerate()} - {self._test_thread}
        self.violations: list[str] = []

    def install(self) -> None:
        for owner, name, what in _entry_points():
            self._monkeypatch.setattr(owner, name, self._guarded(owner, name, what))

    def check_other_threads(self) -> None:
        if self.violations:
            pytest.fail("; ".join(dict.fromkeys(self.violations)), pytrace=False)

    def _guarded(self, owner: object, name: str, what: str) -> Any:
        static = inspect.getattr_static(owner, name)
        if isinstance(static, classmethod):
            return classmethod(self._wrap(static.__func__, f"{_qualname(owner)}.{name}", what))
        return self._wrap(getattr(owner, name), f"{_qualname(owner)}.{name}", what)

    def _wrap(self, original: Callable[..., Any], call: str, what: str) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            thread = threading.get_ident()
            if thread in self._exempt:
                return original(*args, **kwargs)
            message = violation_message(what, call)
            if thread != self._test_thread:
                self.violations.append(message)
            pytest.fail(message, pytrace=True)

        return guarded


def _qualname(owner: object) -> str:
    if inspect.ismodule(owner):
        return owner.__name__
    return f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', owner)}"
