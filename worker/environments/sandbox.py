"""Tool calls in confined child processes: CPU, memory and wall-time limits, no network.

Tools run in a pebble `ProcessPool` of warm children (a call costs a pickle round trip, not a
Python start), started by a forkserver: the worker has torch's threads running, so a plain fork
is unsafe, and a forkserver child inherits none of the worker's sockets or files. Each child,
once, before its first call (`_confine`):
- RLIMIT_AS = `memory_mb` (soft and hard: a tool cannot raise it; an allocation beyond it
  raises MemoryError in the tool) and RLIMIT_CORE = 0;
- a new, empty network namespace (`unshare(CLONE_NEWNET)`, or with CLONE_NEWUSER where the
  worker is not root and user namespaces are allowed): only a down loopback device, so every
  connect fails, to the worker's host and to the internet alike; where neither works
  (a container without the capability), the child is NOT network-isolated, says so
  (`ToolSandbox.network_isolated` is False, and the worker logs it) and relies on what its
  tools do: the built-in tools open no sockets;
- proxy variables removed from its environment.
Each call sets RLIMIT_CPU's soft limit to the CPU time used so far + the call's timeout
(rounded up), so a runaway computation is killed by SIGXCPU even if the wall-clock kill failed,
and the wall-clock timeout (pebble) kills the child and starts a fresh one. The model's text
only ever reaches a tool as the JSON arguments of its call: nothing is `eval`ed.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import math
import multiprocessing
import os
import resource
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pebble import ProcessExpired, ProcessPool

log = logging.getLogger(__name__)

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
START_TIMEOUT_S = 60.0
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "ftp_proxy", "no_proxy")
_isolation = {"network": "none"}  # in a child: what _confine achieved


class ToolFailed(Exception):
    """A tool raised on purpose: its message is shown to the model as the tool's error."""


@dataclass(frozen=True)
class ToolOutcome:
    """What a call produced: a result text, or an error text (and whether it timed out)."""

    result: str | None = None
    error: str | None = None
    timed_out: bool = False


def _unshare_network() -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    for flags, how in ((CLONE_NEWNET, "netns"), (CLONE_NEWUSER | CLONE_NEWNET, "userns+netns")):
        if libc.unshare(flags) == 0:
            return how
    return "none"


def _confine(memory_bytes: int) -> None:
    """Pool initializer (in each child, once). Never raises: pebble would restart the child in
    a loop; what it could not do is reported by `_isolation_of`."""
    for var in _PROXY_VARS:
        os.environ.pop(var, None)
        os.environ.pop(var.upper(), None)
    try:
        _isolation["network"] = _unshare_network()
    except (OSError, AttributeError):  # no libc unshare (not Linux)
        _isolation["network"] = "none"
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def _isolation_of() -> dict[str, str]:
    return dict(_isolation)


def _call(fn: Callable[..., str], arguments: dict[str, Any], cpu_s: int) -> str:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = math.ceil(usage.ru_utime + usage.ru_stime)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + cpu_s if hard == resource.RLIM_INFINITY else min(used + cpu_s, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    return str(fn(**arguments))


class ToolSandbox:
    """A pool of confined children that run tool functions (importable module-level
    functions: they are pickled by reference) with a timeout per call."""

    def __init__(self, *, processes: int = 1, memory_mb: int = 512) -> None:
        if processes < 1 or memory_mb < 64:
            raise ValueError("processes must be >= 1 and memory_mb >= 64")
        self.memory_mb = memory_mb
        self._pool = ProcessPool(
            max_workers=processes,
            initializer=_confine,
            initargs=(memory_mb * 1024 * 1024,),
            context=multiprocessing.get_context("forkserver"),
        )
        isolation = self._pool.submit(_isolation_of, START_TIMEOUT_S).result(
            timeout=2 * START_TIMEOUT_S
        )
        self.network = isolation["network"]
        if not self.network_isolated:
            log.warning("tool processes are not network-isolated here (no namespace allowed)")

    @property
    def network_isolated(self) -> bool:
        return self.network != "none"

    def call(
        self, fn: Callable[..., str], arguments: Mapping[str, Any], timeout_s: float
    ) -> ToolOutcome:
        """Run `fn(**arguments)` in a child; never raises for what the tool does."""
        cpu_s = max(1, math.ceil(timeout_s))
        future = self._pool.submit(_call, timeout_s, fn, dict(arguments), cpu_s)
        try:
            return ToolOutcome(result=future.result(timeout=timeout_s + START_TIMEOUT_S))
        except (TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            return ToolOutcome(error=f"timed out after {timeout_s:g} s", timed_out=True)
        except ProcessExpired as exc:
            return ToolOutcome(error=f"the tool's process died ({_died(exc)})")
        except MemoryError:
            return ToolOutcome(error=f"the tool ran out of memory ({self.memory_mb} MiB)")
        except ToolFailed as exc:
            return ToolOutcome(error=str(exc))
        except Exception as exc:  # noqa: BLE001 - any tool failure is an error message
            return ToolOutcome(error=f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=10)

    def __enter__(self) -> ToolSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _died(exc: ProcessExpired) -> str:
    code = getattr(exc, "exitcode", None)
    if code == -24:  # SIGXCPU
        return "CPU time limit"
    return f"exit code {code}"
