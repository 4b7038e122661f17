"""Adapter versions made ready before a lease needs them (docs/architecture/worker.md,
"Adapters pushed ahead of use").

`AdapterLoads` downloads, verifies (sha256, as every download) and loads a version into the
engine once: in the background when a version is pushed, or in the thread of the first lease
that needs it. A lease whose version is still loading waits for that load while the other held
leases keep generating. A version that fails its checks is logged and never used: the next lease
that needs it tries again and, failing the same way, is released `adapter_invalid`. Older
versions of a run leave the engine once no held lease uses them.

`VersionFeed` learns of new versions from a long-poll (`GET /api/v1/versions`), and also from
heartbeat and acquire answers; it preloads versions of the runs this worker has served.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from protocol.client import ApiError, AsyncGrpoClient
from protocol.error_codes import ErrorCode
from protocol.retrying import Backoff
from protocol.schemas import AdapterRef
from worker.adapters import AdapterCache, AdapterHandle
from worker.backends.base import Backend
from worker.retry import FIRST_WAIT_S

log = logging.getLogger(__name__)

Key = tuple[str, int]


@dataclass(frozen=True)
class LoadRecord:
    """How a version became ready: pushed (background) or by a lease, and when."""

    key: Key
    source: str  # "push" or "lease"
    ready_at: float  # monotonic
    seconds: float  # download + verify + engine load


class AdapterLoads:
    """Versions ready in the engine, each loaded once; thread-safe."""

    def __init__(self, cache: AdapterCache, backend: Backend) -> None:
        self.cache = cache
        self.backend = backend
        self.records: list[LoadRecord] = []
        self._lock = threading.Lock()
        self._loads: dict[Key, Future[AdapterHandle]] = {}
        self._pushed: set[Key] = set()  # versions whose load a push started
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adapter-preload")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _load(self, run_id: str, ref: AdapterRef, source: str) -> AdapterHandle:
        started = time.monotonic()
        handle = self.cache.ensure(run_id, ref.version, ref)
        assert handle is not None  # a ref names a version > 0
        self.backend.load_adapter(handle)
        now = time.monotonic()
        with self._lock:
            self.records.append(LoadRecord(handle.key, source, now, now - started))
        log.info(
            "adapter run=%s v%d ready (%s) in %.2fs", run_id, ref.version, source, now - started
        )
        return handle

    def preload(self, run_id: str, ref: AdapterRef) -> None:
        """Start loading this version in the background unless it is loaded or loading."""
        key = (run_id, ref.version)
        with self._lock:
            if key in self._loads:
                return
            future = self._pool.submit(self._load, run_id, ref, "push")
            self._loads[key] = future
            self._pushed.add(key)
        future.add_done_callback(lambda f: self._forget_failed(key, f))

    def _forget_failed(self, key: Key, future: Future[AdapterHandle]) -> None:
        if future.cancelled() or future.exception() is not None:
            if not future.cancelled():
                log.error("adapter run=%s v%d not preloaded: %r", *key, future.exception())
            with self._lock:
                if self._loads.get(key) is future:
                    del self._loads[key]

    def ready(
        self, run_id: str, version: int, ref: AdapterRef | None, cancel: threading.Event
    ) -> tuple[AdapterHandle | None, bool]:
        """The version's handle once it is ready in the engine (None for version 0) and whether
        a push had started its load before this lease asked. Waits for a load under way (until
        `cancel`); loads it here when nobody has. Raises what the load raises."""
        if version == 0:
            return None, False
        key = (run_id, version)
        with self._lock:
            future = self._loads.get(key)
            pushed = key in self._pushed
            if future is None:  # nobody loads it: this lease does, the others wait for it
                mine: Future[AdapterHandle] = Future()
                self._loads[key] = mine
        if future is not None:
            while not future.done():
                if cancel.wait(0.02):
                    return None, pushed
            if future.exception() is None:
                return future.result(), pushed
            return self._load_for_lease(run_id, version, ref), pushed
        try:
            handle = self._load_now(run_id, version, ref)
        except BaseException as exc:
            with self._lock:
                self._loads.pop(key, None)
            mine.set_exception(exc)
            raise
        mine.set_result(handle)
        return handle, False

    def _load_for_lease(self, run_id: str, version: int, ref: AdapterRef | None) -> AdapterHandle:
        """A load that failed before (a push, or another lease): this lease tries again."""
        handle = self._load_now(run_id, version, ref)
        done: Future[AdapterHandle] = Future()
        done.set_result(handle)
        with self._lock:
            self._loads[(run_id, version)] = done
        return handle

    def _load_now(self, run_id: str, version: int, ref: AdapterRef | None) -> AdapterHandle:
        if ref is None or ref.version != version:
            # The cache raises the precise refusal (a version > 0 without files).
            self.cache.ensure(run_id, version, ref)
            raise AssertionError("unreachable")
        return self._load(run_id, ref, "lease")

    def prune(self, in_use: set[Key]) -> None:
        """Versions older than a run's newest ready one leave the engine unless in use."""
        with self._lock:
            ready = [k for k, f in self._loads.items() if f.done() and f.exception() is None]
            newest: dict[str, int] = {}
            for run_id, version in ready:
                newest[run_id] = max(version, newest.get(run_id, 0))
            old = [k for k in ready if k[1] < newest[k[0]] and k not in in_use]
            for key in old:
                del self._loads[key]
        for key in old:
            self.backend.drop_adapter(key)
            log.info("adapter run=%s v%d left the engine", *key)


def _no_feed(exc: ApiError) -> bool:
    """The server has no version feed: its `route_not_found`, or the bare 404 (no code) of a
    server older than the feed, and so older than error codes."""
    return exc.code == ErrorCode.route_not_found or (exc.code is None and exc.status_code == 404)


class VersionFeed:
    """Long-polls the server for new versions and preloads those of the runs served here."""

    def __init__(
        self,
        client: AsyncGrpoClient,
        loads: AdapterLoads,
        served_runs: Callable[[], set[str]],
        *,
        wait_s: float,
        retry_max_s: float,
    ) -> None:
        self.client = client
        self.loads = loads
        self.served_runs = served_runs
        self.wait_s = wait_s
        self.retry_max_s = retry_max_s
        self.known: dict[uuid.UUID, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._fetch_now = threading.Event()
        self._thread = threading.Thread(target=self._run, name="version-feed", daemon=True)

    def start(self) -> VersionFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._fetch_now.set()
        self._thread.join(timeout=1)

    def notice(self, run_id: uuid.UUID, version: int) -> None:
        """A heartbeat or acquire answer named this version: fetch it unless it is known."""
        with self._lock:
            if version <= self.known.get(run_id, 0):
                return
        if str(run_id) in self.served_runs():
            self._fetch_now.set()

    def notice_all(self, versions: Mapping[uuid.UUID, int]) -> None:
        for run_id, version in versions.items():
            self.notice(run_id, version)

    def _run(self) -> None:
        backoff = Backoff(FIRST_WAIT_S, self.retry_max_s)
        while not self._stop.is_set():
            wait_s = 0.0 if self._fetch_now.is_set() else self.wait_s
            self._fetch_now.clear()
            try:
                self._poll(wait_s)
                backoff.reset()
            except (ApiError, httpx.HTTPError, RuntimeError) as exc:
                if isinstance(exc, ApiError) and _no_feed(exc):
                    log.warning(
                        "the server has no version feed; versions load when leases need them"
                    )
                    return
                if self._stop.is_set():
                    return  # the client was closed under the long-poll: the worker stops
                delay = backoff.next_delay()
                log.warning("version feed failed (%r); retrying in %.1fs", exc, delay)
                self._fetch_now.wait(delay)

    def _poll(self, wait_s: float) -> None:
        with self._lock:
            after = dict(self.known)
        notices = self.client.wait_versions(after, wait_s=wait_s)
        served = self.served_runs()
        for notice in notices:
            with self._lock:
                self.known[notice.run_id] = max(notice.version, self.known.get(notice.run_id, 0))
            if notice.adapter is not None and str(notice.run_id) in served:
                self.loads.preload(str(notice.run_id), notice.adapter)
