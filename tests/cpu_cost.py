"""What each test file costs in CPU seconds (docs/guides/developing.md, "The suite's budget").

On 2 cores under `-n 4` the suite is bound by the CPU: a file's wall seconds depend on what
ran beside it, its CPU seconds do not. Each test's cost is the CPU time (user + system) of its
worker process and of the children it waited for (servers, workers, learners, engines), from
its setup to its teardown; a module's fixtures count in the test that starts or ends them.
The run ends with the files that cost the most and how busy the machine was.

A pytest plugin (tests/conftest.py lists it in `pytest_plugins`); `--cpu-cost=N` sets how
many files the table shows (0: none)."""

from __future__ import annotations

import os
import resource
import time
from collections import Counter

import pytest

KEY = "cpu_s"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-cost",
        type=int,
        default=30,
        help="How many test files the CPU-seconds table lists at the end (0: no table).",
    )


def _cpu_s() -> float:
    """CPU seconds of this process and of its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _machine_busy_s() -> float:
    """CPU seconds every core of the machine spent not idle, since boot."""
    with open("/proc/stat") as stat:
        fields = [float(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


_started: dict[str, float] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _started[item.nodeid] = _cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    if call.when == "teardown" and item.nodeid in _started:
        spent = _cpu_s() - _started.pop(item.nodeid)
        outcome.get_result().user_properties.append((KEY, round(spent, 3)))


class _Totals:
    def __init__(self) -> None:
        self.by_file: Counter[str] = Counter()
        self.wall0 = time.monotonic()
        self.busy0 = _machine_busy_s()


_totals = _Totals()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for key, value in report.user_properties:
        if key == KEY:
            _totals.by_file[report.nodeid.split("::")[0]] += float(value)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    shown = config.getoption("--cpu-cost")
    if not shown or not _totals.by_file or hasattr(config, "workerinput"):
        return
    wall = time.monotonic() - _totals.wall0
    busy = _machine_busy_s() - _totals.busy0
    total = sum(_totals.by_file.values())
    write = terminalreporter.write_line
    terminalreporter.section("CPU seconds by file (the test processes and their children)")
    for path, seconds in _totals.by_file.most_common(shown):
        write(f"{seconds:9.1f}  {100 * seconds / total:5.1f}%  {path}")
    write(
        f"tests: {total:.0f} CPU-s in {wall:.0f} s; the machine: {busy:.0f} CPU-s busy, "
        f"{busy / wall:.2f} of its {os.cpu_count()} cores on average"
    )
