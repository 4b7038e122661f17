"""Module-level tool functions for the sandbox tests (they run in its child processes)."""

from __future__ import annotations

import socket
import time


def hang(expression: str = "") -> str:
    time.sleep(3600)
    return "never"


def spin(expression: str = "") -> str:
    while True:
        pass


def connect(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=2):
        return "connected"


def allocate(mib: int) -> str:
    block = bytearray(mib * 1024 * 1024)
    return str(len(block))


def boom(expression: str = "") -> str:
    raise RuntimeError("the tool broke")
