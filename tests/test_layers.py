"""The test layers (tests/layers.py, docs/guides/testing-layers.md) on small test files run
by pytester: what each test is classified as, and the unit layer's guard failing a test that
opens a socket, a database or a process."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from tests.layers import DYNAMIC_REQUESTS, E2E_FIXTURES, INTEGRATION_FIXTURES, LAYERS

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
MESSAGE = "mark it integration or use a fixture that says so"

# Stand-ins by name only: classification reads names, and these never run a database.
NAMED_FIXTURES = """
import pytest

@pytest.fixture
def pg_url():
    return "postgresql://nowhere/x"

@pytest.fixture
def app(pg_url):
    return pg_url

@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path}/x.db"

@pytest.fixture(params=["postgres", "sqlite"])
def db_url(request):
    return request.getfixturevalue("pg_url" if request.param == "postgres" else "sqlite_url")

@pytest.fixture
def e2e():
    return None
"""


@pytest.fixture
def layered(pytester: pytest.Pytester, request: pytest.FixtureRequest) -> pytest.Pytester:
    """A pytester tree with this suite's markers registered and the layers plugin loaded."""
    markers = "\n    ".join(request.config.getini("markers"))
    pytester.makeini(
        f"[pytest]\naddopts = -p tests.layers --strict-markers\nmarkers =\n    {markers}\n"
    )
    pytester.makeconftest(NAMED_FIXTURES)
    return pytester


def _layers_of(pytester: pytest.Pytester, source: str) -> dict[str, set[str]]:
    pytester.makepyfile(test_classified=source)
    items, _ = pytester.inline_genitems()
    wanted = set(LAYERS) | {"postgres"}
    return {item.name: {m.name for m in item.iter_markers()} & wanted for item in items}


def test_each_test_gets_one_layer_from_what_it_reaches(layered: pytest.Pytester) -> None:
    got = _layers_of(
        layered,
        """
import pytest

def test_plain(): pass
def test_tmp(tmp_path): pass
def test_pg(pg_url): pass
def test_on_the_app(app): pass
def test_both(db_url): pass
def test_cluster(e2e): pass

@pytest.mark.e2e
def test_marked_e2e(): pass

@pytest.mark.integration
def test_overridden(): pass

@pytest.mark.slow
def test_slow(): pass
""",
    )
    assert got == {
        "test_plain": {"unit"},
        "test_tmp": {"unit"},
        "test_pg": {"integration", "postgres"},
        "test_on_the_app": {"integration", "postgres"},  # app builds on pg_url
        "test_both[postgres]": {"integration", "postgres"},
        "test_both[sqlite]": {"integration"},
        "test_cluster": {"e2e"},
        "test_marked_e2e": {"e2e"},
        "test_overridden": {"integration"},
        "test_slow": {"integration"},
    }


def test_a_marker_lighter_than_what_the_test_reaches_is_refused(layered: pytest.Pytester) -> None:
    layered.makepyfile(
        """
import pytest

@pytest.mark.unit
def test_claims_unit(pg_url): pass
"""
    )
    result = layered.runpytest("--collect-only")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*test_claims_unit: marked unit but it reaches an integration*"])


def test_not_postgres_deselects_every_postgres_run(layered: pytest.Pytester) -> None:
    layered.makepyfile(
        """
def test_pg(app): pass
def test_both(db_url): pass
def test_plain(): pass
"""
    )
    result = layered.runpytest("--collect-only", "-q", "-m", "not postgres")
    result.stdout.fnmatch_lines(
        ["*::test_both[[]sqlite[]]", "*::test_plain", "2/4 tests collected*"]
    )


@pytest.mark.parametrize(
    ("body", "opened"),
    [
        ("socket.socket().bind(('127.0.0.1', 0))", "opened a socket"),
        ("socket.create_connection(('127.0.0.1', 9), timeout=1)", "opened a socket"),
        ("sqlite3.connect(':memory:')", "opened a database connection"),
        ("sqlalchemy.create_engine('sqlite://').connect()", "opened a database connection"),
        ("subprocess.run(['true'])", "started a subprocess"),
        ("multiprocessing.Process(target=print).start()", "started a subprocess"),
    ],
)
def test_a_unit_test_that_opens_a_resource_fails_naming_it(
    layered: pytest.Pytester, body: str, opened: str
) -> None:
    layered.makepyfile(
        f"""
import multiprocessing, socket, sqlite3, subprocess
import pytest, sqlalchemy

def test_unit():
    {body}

@pytest.mark.integration
def test_integration():
    try:
        {body}
    except OSError:
        pass  # nothing listens on port 9: refused, not stopped by the guard
"""
    )
    result = layered.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [f"E*Failed: unit test {opened}: {MESSAGE}*", "FAILED *::test_unit*"]
    )


def test_a_fixture_that_names_the_resource_lets_a_test_open_it(layered: pytest.Pytester) -> None:
    layered.makepyfile(
        """
import socket, subprocess

def test_spawns(subprocess_allowed):
    subprocess.run(["true"], check=True)

def test_listens(network_allowed):
    socket.socket().bind(("127.0.0.1", 0))

def test_plain_after_them():
    import sqlite3
    sqlite3.connect(":memory:")
"""
    )
    result = layered.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)  # the guard is back for the plain test
    result.stdout.fnmatch_lines(
        [
            f"E*unit test opened a database connection: {MESSAGE}*",
            "FAILED *::test_plain_after_them*",
        ]
    )


def test_a_thread_the_unit_test_starts_fails_it_at_teardown(layered: pytest.Pytester) -> None:
    layered.makepyfile(
        """
import socket, threading

def test_unit():
    def listen():
        try:
            socket.socket().bind(("127.0.0.1", 0))
        except BaseException:
            pass  # the thread swallows it: the guard still reports it
    thread = threading.Thread(target=listen)
    thread.start()
    thread.join()
"""
    )
    result = layered.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"*unit test opened a socket: {MESSAGE}*"])


@cache
def _fixture_functions() -> dict[str, list[ast.FunctionDef]]:
    """Every fixture function under tests/, by name (parsed once for both checks)."""
    found: dict[str, list[ast.FunctionDef]] = {}
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                "fixture" in ast.unparse(d) for d in node.decorator_list
            ):
                found.setdefault(node.name, []).append(node)
    return found


def test_every_fixture_the_rules_name_is_defined() -> None:
    defined = set(_fixture_functions()) | {"pytester"}
    assert (INTEGRATION_FIXTURES | E2E_FIXTURES) - defined == set()


def test_every_fixture_requesting_another_at_run_time_is_in_the_dynamic_table() -> None:
    """pytest's closure cannot see request.getfixturevalue: tests/layers.py lists each."""
    dynamic = {
        name
        for name, defs in _fixture_functions().items()
        for node in defs
        if "getfixturevalue" in ast.unparse(node)
    }
    assert dynamic == set(DYNAMIC_REQUESTS)
