"""The typed client works with whichever HTTP client it is handed (docs/decisions/0016): httpx,
httpx2 (the fork Starlette's TestClient, huggingface_hub and openai moved to) and Starlette's
TestClient over either. It never passes one library's sentinel or type to the other: a call
with the client's own timeout and one with its own (`timeout_s`) both go through, an error
status raises the typed error, and each library's transport errors are retried."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest

from protocol.client import AsyncGrpoClient, ConflictError
from tests.harness.serve import serve_in_thread
from tests.s3_fixtures import free_port
from tests.server.learner.support import FP, make_run, make_worker

pytestmark = pytest.mark.timeout(120)

KINDS = ["httpx", "httpx2", "testclient-httpx2", "testclient-httpx"]


def _testclient_over_httpx() -> type:
    """Starlette's TestClient class as built when httpx2 is not installed (deprecated there, and
    what an environment without httpx2 gets)."""
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if "testclient" in name}
    sys.modules["httpx2"] = None  # type: ignore[assignment]  # import httpx2 -> ImportError
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # StarletteDeprecationWarning
            module = importlib.import_module("starlette.testclient")
        return module.TestClient  # type: ignore[no-any-return]
    finally:
        sys.modules["httpx2"] = httpx2
        for name in [n for n in sys.modules if "testclient" in n]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture(params=KINDS)
def http(request: pytest.FixtureRequest, app: Any) -> Iterator[tuple[str, Any]]:
    kind = request.param
    if kind.startswith("testclient"):
        from starlette.testclient import TestClient

        cls = TestClient if kind == "testclient-httpx2" else _testclient_over_httpx()
        with cls(app, base_url="http://testserver") as client:
            yield "http://testserver", client
        return
    library = httpx if kind == "httpx" else httpx2
    with serve_in_thread(app) as url, library.Client(base_url=url, timeout=10.0) as client:
        yield url, client


def test_which_library_each_kind_runs_on(http: tuple[str, Any], request: Any) -> None:
    kind = request.node.callspec.params["http"]
    _, client = http
    base = httpx.Client if kind in ("httpx", "testclient-httpx") else httpx2.Client
    assert isinstance(client, base)  # the fixture really covers both libraries


def test_a_learner_and_a_worker_round_trip_through_each_http_library(
    http: tuple[str, Any], app: Any
) -> None:
    url, client = http
    run = make_run(app)
    _, worker_token = make_worker(app)
    learner = AsyncGrpoClient(url, run.token, http=client, max_retries=0)
    worker = AsyncGrpoClient(url, worker_token, http=client, max_retries=0)
    rid = str(run.id)

    fencing = learner.learner_attach(rid, FP).fencing  # the client's own timeout
    assert learner.learner_heartbeat(rid, fencing).status == "running"
    with pytest.raises(ConflictError) as refused:
        learner.learner_attach(rid, FP)
    assert refused.value.status_code == 409 and refused.value.code
    worker.acquire_lease(models=["smollm2-135m-instruct"], timeout_s=5.0)  # a timeout of its own
    assert learner.learner_heartbeat(rid, fencing).status == "running"


@pytest.mark.parametrize("library", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_each_librarys_transport_errors_are_retried(library: Any, network_allowed: None) -> None:
    """Nothing listens on the port: a connection error of that library, retried, then raised."""
    slept: list[float] = []
    url = f"http://127.0.0.1:{free_port()}"
    with library.Client(base_url=url, timeout=2.0) as client:
        api = AsyncGrpoClient(url, "t", http=client, max_retries=2, sleep=slept.append)
        with pytest.raises(library.ConnectError):
            api.request("GET", "/healthz")
    assert len(slept) == 2  # two retries, then the error
