"""The worker's loop: register once, then keep acquiring leases while the sequences held stay
under `max_inflight_sequences`, each held lease worked in its own thread on the one engine.

It never crashes on the network: an unreachable server or bucket is retried with exponential
backoff and jitter. Each held lease keeps its own fencing token, heartbeat (one batched call for
all of them, heartbeat.py) and abort: a 409 (or 404) or `abort: true` drops that lease's work
only. New adapter versions are loaded before leases need them (versions.py). An engine death
releases every lease it broke and restarts the engine (engine.py). `request_stop()` (SIGTERM or
SIGINT, a spot preemption notice) cancels every generation, releases every held lease at once
and ends the loop.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from protocol.client import AsyncGrpoClient
from protocol.environments import EnvironmentAllowlist
from protocol.retrying import Backoff
from protocol.schemas import Lease, ReleaseReason
from worker import capabilities
from worker.adapters import AdapterCache
from worker.backends.base import Backend, EngineFault
from worker.config import WorkerSettings
from worker.credentials import Credentials
from worker.engine import EngineFailing, EngineGuard, FaultWindow
from worker.environments.base import EnvironmentSetupError
from worker.heartbeat import HeartbeatPump
from worker.held import HeldLease, HeldLeases
from worker.lease_work import LeaseRecord, LeaseWork, Outcome
from worker.prompts import PromptEncoder
from worker.registration import obtain_credentials
from worker.retry import Stopping, retry, sleep_unless_stopped
from worker.rollouts import EnvironmentRollouts, environment_of, is_multi_turn
from worker.versions import AdapterLoads, VersionFeed

__all__ = ["EngineFailing", "LeaseRecord", "Outcome", "WorkerLoop"]

log = logging.getLogger(__name__)
T = TypeVar("T")
CAPACITY_POLL_S = 0.5  # how often a full worker re-checks for stop while waiting for room


class WorkerLoop:
    """One worker: a backend for one base model, a control-plane client, an adapter cache."""

    def __init__(
        self,
        settings: WorkerSettings,
        backend: Backend,
        *,
        fingerprint: str,
        encoder: PromptEncoder,
        client_factory: Callable[..., AsyncGrpoClient] = AsyncGrpoClient,
        credentials: Credentials | None = None,
    ) -> None:
        self.settings = settings
        self.credentials = credentials  # None: from the token file, or registering
        self.backend = backend
        self.fingerprint = fingerprint
        self.encoder = encoder
        self._client_factory = client_factory
        self.held = HeldLeases()
        self.adapters = AdapterCache(
            settings.adapter_cache_dir,
            settings.adapter_cache_bytes,
            in_use=self.held.adapter_keys,  # a held lease's version stays on disk
        )
        self.loads = AdapterLoads(self.adapters, backend)
        self.stop_event = threading.Event()
        self.history: list[LeaseRecord] = []
        self.max_inflight = settings.max_inflight_sequences or backend.default_inflight_sequences
        self.worker_id: str | None = None
        self.client: AsyncGrpoClient | None = None
        self.feed: VersionFeed | None = None
        self.served_runs: set[str] = set()
        self._granted = 0
        self._threads: list[threading.Thread] = []
        self._fatal: BaseException | None = None
        self._faults = FaultWindow(settings.engine_fault_limit, settings.engine_fault_window_s)
        self.guard = EngineGuard(self._restart_engine)
        self.work: LeaseWork | None = None
        # What this worker can run (declared at registration and with every acquire).
        self.allowed = EnvironmentAllowlist.discover(settings.environment_modules)
        self.environments = self.allowed.names()
        # What its engine can load (declared with every acquire, so a restart with another
        # --vllm-max-lora-rank is seen at once).
        self.capabilities = capabilities.declared(settings, capabilities.generation_dtype(settings))
        self.rollouts = EnvironmentRollouts(
            backend, allowed=self.allowed, tool_memory_mb=settings.tool_memory_mb
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def _new_client(self, token: str | None = None, *, max_retries: int = 2) -> AsyncGrpoClient:
        if token is None and self.client is not None:
            token = self.client.token
        return self._client_factory(
            self.settings.server_url,
            token,
            timeout_s=self.settings.http_timeout_s,
            max_retries=max_retries,
            retry_cap_s=2.0,
        )

    def request_stop(self) -> None:
        """Ask the loop to end: every generation is cancelled and every held lease released."""
        self.stop_event.set()
        for held in self.held.snapshot():
            held.cancel.set()

    def _sleep(self, seconds: float) -> None:
        sleep_unless_stopped(self.stop_event, seconds)

    def _retry(self, what: str, call: Callable[[], T]) -> T:
        return retry(what, call, stop=self.stop_event, cap_s=self.settings.retry_max_s)

    def run(self) -> list[LeaseRecord]:
        """Run until stopped (or `max_leases` leases ended); returns what happened per lease."""
        pump: HeartbeatPump | None = None
        try:
            self._register()
            pump = HeartbeatPump(self._new_client(max_retries=0), self.held, self._version_seen)
            pump.start()
            self.feed = self._start_feed()
            self._serve()
        except Stopping:
            pass
        finally:
            self.request_stop()
            self._join_leases(self.settings.shutdown_grace_s + 2.0)
            self.release_all("shutdown")
            if pump is not None:
                pump.stop()
                pump.client.close()
            if self.feed is not None:
                self.feed.stop()
                self.feed.client.close()
            self.loads.close()
            self.rollouts.close()
            if self.client is not None:
                self.client.close()
        if self._fatal is not None:
            raise self._fatal
        return self.history

    def _start_feed(self) -> VersionFeed:
        feed = VersionFeed(
            self._new_client(max_retries=0),
            self.loads,
            lambda: set(self.served_runs),
            wait_s=self.settings.acquire_wait_s,
            retry_max_s=self.settings.retry_max_s,
        )
        return feed.start()

    def _version_seen(self, run_id: uuid.UUID, version: int) -> None:
        if self.feed is not None:
            self.feed.notice(run_id, version)

    # -- registration ---------------------------------------------------------------------------

    def _register(self) -> None:
        s = self.settings
        creds = self.credentials or obtain_credentials(
            s, environments=self.environments, stop=self.stop_event, new_client=self._new_client
        )
        self.worker_id = creds.worker_id
        self.client = self._new_client(creds.token)
        self.work = LeaseWork(
            settings=s,
            backend=self.backend,
            encoder=self.encoder,
            fingerprint=self.fingerprint,
            worker_id=creds.worker_id,
            new_client=self._new_client,
            loads=self.loads,
            guard=self.guard,
            stop=self.stop_event,
            generated=self.held.generated,
            rollouts=self.rollouts,
        )

    # -- polling --------------------------------------------------------------------------------

    def _serve(self) -> None:
        s = self.settings
        idle = Backoff(s.idle_backoff_min_s, s.idle_backoff_max_s)
        assert self.client is not None
        client = self.client
        while not self.stop_event.is_set():
            if s.max_leases is not None and self._granted >= s.max_leases:
                self._drain()
                return
            room = self.held.wait_below(self.max_inflight, CAPACITY_POLL_S)
            if not room or self.stop_event.is_set():
                continue
            lease, versions, sent_at = self._retry("acquire", lambda: self._acquire(client))
            if self.feed is not None:
                self.feed.notice_all(versions)
            if lease is None:
                self._sleep(idle.next_delay())
                continue
            if self._take(lease, sent_at):
                idle.reset()
            else:
                self._sleep(idle.next_delay())  # a lease we cannot serve: do not spin on it

    def _acquire(self, client: AsyncGrpoClient) -> tuple[Lease | None, dict[uuid.UUID, int], float]:
        """One acquire call, and when it was sent: the server grants no earlier, so the lease's
        TTL is counted from then (a slow answer must not lengthen it here)."""
        s = self.settings
        sent_at = time.monotonic()
        lease, versions = client.acquire_lease_and_versions(
            models=[s.model],
            wait_s=s.acquire_wait_s,
            timeout_s=s.http_timeout_s,
            environments=self.environments,
            capabilities=self.capabilities,
        )
        return lease, versions, sent_at

    def _take(self, lease: Lease, sent_at: float) -> bool:
        """Start working a granted lease in its own thread; False when it is refused here."""
        self._granted += 1
        held = self.held.add(lease, sent_at)
        refusal = self._refusal(lease)
        if refusal is not None:
            log.warning(
                "lease %s of run %s refused here: %s", lease.lease_id, lease.run_id, refusal
            )
        if refusal is not None or self.stop_event.is_set():
            assert self.work is not None
            record = LeaseRecord(lease.lease_id, lease.run_id, lease.adapter_version, Outcome.lost)
            reason: ReleaseReason = "unservable" if refusal is not None else "shutdown"
            record.outcome, record.reason = self.work.give_back(held, reason), refusal or reason
            self._finish(held, record)
            return False
        self.served_runs.add(str(lease.run_id))
        thread = threading.Thread(
            target=self._work, args=(held,), name=f"lease-{lease.lease_id}", daemon=True
        )
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return True

    def _work(self, held: HeldLease) -> None:
        assert self.work is not None
        record = LeaseRecord(
            held.lease_id, held.lease.run_id, held.lease.adapter_version, Outcome.lost
        )
        try:
            self.work.run(held, record)
        except (EngineFailing, Stopping) as exc:
            if isinstance(exc, EngineFailing):
                self._fatal = exc
            self.request_stop()
            record.reason = record.reason or str(exc)
        except Exception as exc:  # a bug must not leave the lease held: release it, stop
            log.exception("lease %s failed", held.lease_id)
            self._fatal = exc
            self.request_stop()
        finally:
            self._finish(held, record)

    def _finish(self, held: HeldLease, record: LeaseRecord) -> None:
        self.history.append(record)
        self.held.remove(held)
        self.loads.prune(self.held.adapter_keys())
        log.info("lease %s: %s %s", record.lease_id, record.outcome, record.reason or "")

    def _drain(self) -> None:
        """Wait for every held lease to end (max_leases reached)."""
        while not self.held.wait_empty(CAPACITY_POLL_S):
            if self.stop_event.is_set():
                return

    def _join_leases(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _refusal(self, lease: Lease) -> str | None:
        """Why this worker cannot serve the lease (model or tokenizer mismatch, an adapter its
        engine cannot load, an environment it cannot run), or None."""
        if lease.base_model != self.settings.model:
            return f"base model {lease.base_model!r} is not served here"
        if lease.tokenizer_fingerprint not in (None, self.fingerprint):
            return "tokenizer fingerprint mismatch"
        adapter = capabilities.lease_refusal(lease, self.capabilities)
        if adapter is not None:
            return adapter
        if is_multi_turn(lease):
            try:
                self.rollouts.environment(environment_of(lease))
            except (EnvironmentSetupError, ValueError) as exc:
                return f"environment: {exc}"
        return None

    def _restart_engine(self, why: str) -> None:
        """After an engine death: stop when deaths come too often, else restart it with backoff
        (a restart that fails is one more death)."""
        s = self.settings
        backoff = Backoff(1.0, s.retry_max_s)
        while True:
            if self._faults.record(time.monotonic()):
                raise EngineFailing(
                    f"the engine died {s.engine_fault_limit} times within "
                    f"{s.engine_fault_window_s:g} s (last: {why}); the worker stops"
                )
            self._sleep(backoff.next_delay())
            try:
                self.backend.restart()
            except EngineFault as exc:
                why = str(exc)
                continue
            log.warning("engine restarted after: %s", why)
            return

    # -- shutdown -------------------------------------------------------------------------------

    def release_all(self, reason: str, timeout_s: float | None = None) -> None:
        """Release every held lease at once, each in its own thread (safe from any thread)."""
        if self.work is None:
            return
        work = self.work
        grace = timeout_s or self.settings.shutdown_grace_s
        leases = [h for h in self.held.snapshot() if not h.released]
        for held in leases:
            held.cancel.set()
        if leases:
            log.info("releasing %d held leases: %s", len(leases), reason)
        threads = [
            threading.Thread(target=work.release, args=(h, "shutdown", grace), daemon=True)
            for h in leases
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + grace
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
