"""Test layers (docs/guides/testing-layers.md): every test gets exactly one of `unit`,
`integration`, `e2e`, derived from the fixtures it reaches and its markers, and `postgres`
when it reaches a Postgres database. A `unit` test that opens a socket, a database connection
or a process fails (tests/layer_guard.py).

A pytest plugin (tests/conftest.py lists it in `pytest_plugins`): the rules below are the only
home of the classification."""

from __future__ import annotations

from collections.abc import Iterator, Set

import pytest

from tests.layer_guard import UnitGuard

LAYERS = ("unit", "integration", "e2e")  # lightest first

# Crosses processes: the system's own server, workers, learner, or a browser.
E2E_MARKERS = frozenset({"e2e", "vllm", "browser"})
E2E_FIXTURES = frozenset(
    {
        "e2e",  # tests/e2e/conftest.py: a whole Cluster
        "server",  # tests/worker/: the server as a subprocess (ServerProcess)
        "make_stack",  # tests/worker/conftest.py: server, workers and learner
        "chromium",  # tests/browser/
    }
)

# Every fixture that builds a Postgres database reaches one of these (the closure pytest
# computes is transitive: app, client, settings, live, servers... need no entry of their own).
POSTGRES_FIXTURES = frozenset(
    {
        "pg_admin",
        "pg_template",
        "pg_url",
        "db_session",
        "lease_pg_database",
        "emptied_lease_pg_database",
    }
)
SQLITE_FIXTURES = frozenset({"sqlite_url"})
BOTH_DATABASES_FIXTURES = frozenset({"db_url", "lease_path"})  # parametrized: one per database
S3_FIXTURES = frozenset({"moto_endpoint", "s3_bucket", "s3_store", "bucket_proxy"})
NETWORK_FIXTURES = frozenset({"truncating_endpoint", "network_allowed"})
MODEL_FIXTURES = frozenset(
    {
        "small_model_dir",
        "small_tokenizer",
        "small_model",
        "tx_backend",  # tests/worker/conftest.py
        "make_backend",  # tests/worker/test_transformers_concurrency.py
        "rolled_out",  # tests/learner/test_trajectory_logprobs.py
        "tool_call_rollout",  # tests/learner/test_trajectory_logprobs.py
    }
)
SUBPROCESS_FIXTURES = frozenset(
    {
        "sandbox",  # ToolSandbox: its children
        "two_ranks",  # torch.multiprocessing ranks
        "two_ranks_fsdp",
        "ranks",
        "pytester",  # the inner session's tests may open anything
        "subprocess_allowed",
    }
)
INTEGRATION_FIXTURES = (
    POSTGRES_FIXTURES
    | SQLITE_FIXTURES
    | BOTH_DATABASES_FIXTURES
    | S3_FIXTURES
    | NETWORK_FIXTURES
    | MODEL_FIXTURES
    | SUBPROCESS_FIXTURES
)
# `slow` runs the real model or many processes; `postgres` needs the service.
INTEGRATION_MARKERS = frozenset({"slow", "postgres"})

# Fixtures that request another by name at run time (request.getfixturevalue), which pytest's
# closure cannot see: {fixture: {its parameter: the fixture it requests}}.
DYNAMIC_REQUESTS: dict[str, dict[str, str]] = {
    "db_url": {"postgres": "pg_url", "sqlite": "sqlite_url"},
    "lease_path": {"postgres": "emptied_lease_pg_database", "sqlite": "sqlite_url"},
    "store": {"s3": "s3_store"},
}


def reached_fixtures(item: pytest.Item) -> set[str]:
    """The test's fixture closure plus what its parametrized fixtures request at run time."""
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    for fixture, param in callspec.params.items() if callspec else ():
        if fixture in names and isinstance(param, str):
            requested = DYNAMIC_REQUESTS.get(fixture, {}).get(param)
            if requested is not None:
                names.add(requested)
    return names


def derived_layer(fixtures: Set[str], markers: Set[str]) -> str:
    if markers & E2E_MARKERS or fixtures & E2E_FIXTURES:
        return "e2e"
    if markers & INTEGRATION_MARKERS or fixtures & INTEGRATION_FIXTURES:
        return "integration"
    return "unit"


def layer_of(item: pytest.Item) -> str:
    """The derived layer, or the item's own layer marker where it names a heavier one (an
    override for what the fixtures cannot show); a lighter one, or two, is a usage error."""
    markers = {mark.name for mark in item.iter_markers()}
    derived = derived_layer(reached_fixtures(item), markers)
    explicit = markers & set(LAYERS)
    if len(explicit) > 1:
        raise pytest.UsageError(f"{item.nodeid}: more than one layer marker: {sorted(explicit)}")
    if not explicit:
        return derived
    (chosen,) = explicit
    if LAYERS.index(chosen) < LAYERS.index(derived):
        raise pytest.UsageError(
            f"{item.nodeid}: marked {chosen} but it reaches an {derived} resource "
            "(docs/guides/testing-layers.md)"
        )
    return chosen


def reaches_postgres(item: pytest.Item) -> bool:
    return bool(reached_fixtures(item) & POSTGRES_FIXTURES)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        layer = layer_of(item)
        if item.get_closest_marker(layer) is None:
            item.add_marker(layer)
        if reaches_postgres(item) and item.get_closest_marker("postgres") is None:
            item.add_marker("postgres")


@pytest.fixture(autouse=True)
def _unit_layer_guard(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """In a `unit` test, sockets, database connections and processes fail the test."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    guard = UnitGuard(monkeypatch)
    guard.install()
    yield
    guard.check_other_threads()


@pytest.fixture
def subprocess_allowed() -> None:
    """Requested by a test that starts a process itself: it makes the test `integration`."""


@pytest.fixture
def network_allowed() -> None:
    """Requested by a test that opens a socket itself: it makes the test `integration`."""
