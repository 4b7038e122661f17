"""The tool sandbox: wall-time and CPU limits kill, memory is capped, the network is gone, and
the pool recovers for the next call."""

from __future__ import annotations

import json
import math
import socket
import time

import pytest

from tests.worker.environments import sandbox_tools
from worker.environments.calculator import calculator
from worker.environments.sandbox import ToolSandbox


def test_calls_return_results_and_errors(sandbox: ToolSandbox) -> None:
    assert sandbox.call(calculator, {"expression": "6*7"}, 5).result == "42"
    refused = sandbox.call(calculator, {"expression": "__import__('os')"}, 5)
    assert refused.result is None and "Call is not allowed" in str(refused.error)
    broke = sandbox.call(sandbox_tools.boom, {}, 5)
    assert broke.error == "RuntimeError: the tool broke" and not broke.timed_out


def test_hang_is_killed_by_the_timeout(sandbox: ToolSandbox) -> None:
    started = time.monotonic()
    outcome = sandbox.call(sandbox_tools.hang, {}, 0.5)
    assert outcome.timed_out and outcome.error == "timed out after 0.5 s"
    assert time.monotonic() - started < 5
    assert sandbox.call(calculator, {"expression": "1+1"}, 5).result == "2"  # a fresh child


def test_busy_loop_is_killed(sandbox: ToolSandbox) -> None:
    outcome = sandbox.call(sandbox_tools.spin, {}, 1.0)
    assert outcome.result is None and outcome.error is not None
    assert sandbox.call(calculator, {"expression": "2*3"}, 5).result == "6"


def test_each_call_runs_under_cpu_memory_and_core_limits(sandbox: ToolSandbox) -> None:
    """The limits themselves, read inside the child during a call: the address space is the
    sandbox's memory (soft = hard, so a tool cannot raise it), no core files, and a CPU-time
    soft limit of the CPU used so far + the call's timeout (rounded up), which kills a
    spinning tool by SIGXCPU even where the wall-clock kill fails."""
    outcome = sandbox.call(sandbox_tools.limits, {}, 2.5)
    assert outcome.result is not None, outcome.error
    seen = json.loads(outcome.result)
    cap = 256 * 1024 * 1024
    assert seen["as"] == [cap, cap] and seen["core"] == [0, 0]
    soft = seen["cpu"][0]
    assert math.ceil(seen["used"]) + 2 <= soft <= math.ceil(seen["used"]) + 3  # ceil(2.5) = 3


def test_memory_is_capped(sandbox: ToolSandbox) -> None:
    outcome = sandbox.call(sandbox_tools.allocate, {"mib": 1024}, 5)
    assert outcome.error == "the tool ran out of memory (256 MiB)"
    assert sandbox.call(sandbox_tools.allocate, {"mib": 16}, 5).result == str(16 * 1024 * 1024)


def test_no_network(sandbox: ToolSandbox) -> None:
    """A listening socket on this host is reachable from here, not from a tool."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        if not sandbox.network_isolated:
            pytest.skip("no network namespace can be made here: tools are not isolated")
        outcome = sandbox.call(sandbox_tools.connect, {"host": "127.0.0.1", "port": port}, 5)
        assert outcome.result is None and "unreachable" in str(outcome.error)
    finally:
        server.close()
