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


def limits() -> str:
    """The child's resource limits while it runs a call: address space, CPU time, core size,
    and the CPU time it has used so far."""
    import json
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return json.dumps(
        {
            "as": resource.getrlimit(resource.RLIMIT_AS),
            "cpu": resource.getrlimit(resource.RLIMIT_CPU),
            "core": resource.getrlimit(resource.RLIMIT_CORE),
            "used": usage.ru_utime + usage.ru_stime,
        }
    )
