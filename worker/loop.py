"""The worker's loop: register once, poll for leases, generate, upload the batch, complete.

It never crashes on the network: an unreachable server or bucket is retried with exponential
backoff and jitter; a 409 (or 404) on a fenced call means the lease is lost and the work is
dropped; `abort: true` on a heartbeat stops generation at once. `request_stop()` (SIGTERM or
SIGINT, a spot preemption notice) cancels generation, releases the current lease and ends
the loop.
"""

from __future__ import annotations

import collections
import enum
import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from protocol.adapters import AdapterMismatch
from protocol.batches import BatchFileInfo, BatchMetadata, RolloutSample, write_batch
from protocol.client import ApiError, AsyncGrpoClient, ConflictError, NotFoundError
from protocol.schemas import BatchManifest, Lease, ReleaseReason
from protocol.storage import ObjectExists, PresignedPut, StoreError
from protocol.transfer import ChecksumMismatch, upload_presigned
from worker import credentials
from worker.adapters import AdapterCache
from worker.backends.base import (
    Backend,
    Completion,
    EngineFault,
    GenerationCancelled,
    SamplingSpec,
)
from worker.config import WorkerSettings
from worker.heartbeat import Heartbeat
from worker.prompts import PromptEncoder

log = logging.getLogger(__name__)
T = TypeVar("T")
LOST = (ConflictError, NotFoundError)


class Outcome(enum.StrEnum):
    accepted = "accepted"
    rejected = "rejected"
    lost = "lost"  # 409/404, abort, or expiry: the work was dropped
    released = "released"  # given back (shutdown, or a lease this worker cannot serve)
    stopped = "stopped"  # shutdown while the release itself failed


class Stopping(Exception):
    """The loop was asked to stop while waiting or retrying."""


class LeaseLost(Exception):
    """A fenced call answered 409/404, or the heartbeat saw the lease end."""


class EngineFailing(SystemExit):
    """The engine died engine_fault_limit times within engine_fault_window_s: the worker stops
    (a supervisor, or the spot fleet, may start a fresh one)."""


class FaultWindow:
    """Engine deaths within a sliding window of monotonic time."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit, self.window_s = limit, window_s
        self.times: collections.deque[float] = collections.deque()

    def record(self, now: float) -> bool:
        """Count a death now; True when the limit is reached within the window."""
        self.times.append(now)
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()
        return len(self.times) >= self.limit


@dataclass
class LeaseRecord:
    lease_id: uuid.UUID
    run_id: uuid.UUID
    adapter_version: int
    outcome: Outcome
    reason: str | None = None
    n_samples: int = 0
    n_tokens: int = 0
    generation_seconds: float = 0.0
    engine_fault: str | None = None  # why the engine died generating this lease


class Backoff:
    """Exponential backoff with full jitter, bounded by `cap_s`."""

    def __init__(self, base_s: float, cap_s: float) -> None:
        self.base_s, self.cap_s, self.attempt = base_s, cap_s, 0

    def next_delay(self) -> float:
        delay = random.uniform(0.5, 1.0) * min(self.cap_s, self.base_s * 2**self.attempt)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


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
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.fingerprint = fingerprint
        self.encoder = encoder
        self._client_factory = client_factory
        self.adapters = AdapterCache(settings.adapter_cache_dir, settings.adapter_cache_bytes)
        self.stop_event = threading.Event()
        self.history: list[LeaseRecord] = []
        self.worker_id: str | None = None
        self.client: AsyncGrpoClient | None = None
        self._current: Lease | None = None
        self._cancel = threading.Event()
        self._release_lock = threading.Lock()
        self._released: set[uuid.UUID] = set()
        self._faults = FaultWindow(settings.engine_fault_limit, settings.engine_fault_window_s)

    # -- lifecycle ------------------------------------------------------------------------------

    def _new_client(self, token: str | None, *, max_retries: int = 2) -> AsyncGrpoClient:
        return self._client_factory(
            self.settings.server_url,
            token,
            timeout_s=self.settings.http_timeout_s,
            max_retries=max_retries,
            retry_cap_s=2.0,
        )

    def request_stop(self) -> None:
        """Ask the loop to end: generation is cancelled and the lease released."""
        self.stop_event.set()
        self._cancel.set()

    def _sleep(self, seconds: float) -> None:
        if self.stop_event.wait(seconds):
            raise Stopping()

    def _retry(self, what: str, call: Callable[[], T], *, lease: bool = False) -> T:
        """Retry transient failures (network, 5xx, bucket) with backoff until stopped.

        With `lease=True`, a cancelled lease (abort, loss) ends the retries with LeaseLost."""
        backoff = Backoff(0.5, self.settings.retry_max_s)
        while True:
            if lease and self._cancel.is_set() and not self.stop_event.is_set():
                raise LeaseLost("lease ended while retrying " + what)
            try:
                return call()
            except LOST:
                raise
            except (httpx.HTTPError, StoreError, OSError) as exc:
                delay = backoff.next_delay()
                log.warning("%s failed (%r); retrying in %.1fs", what, exc, delay)
            except ApiError as exc:
                if exc.status_code < 500 and exc.status_code != 429:
                    raise
                delay = backoff.next_delay()
                log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
            self._sleep(delay)

    def run(self) -> list[LeaseRecord]:
        """Run until stopped (or `max_leases` leases ended); returns what happened per lease."""
        try:
            self._register()
            self._serve()
        except Stopping:
            pass
        finally:
            self.release_current("shutdown")
            if self.client is not None:
                self.client.close()
        return self.history

    # -- registration ---------------------------------------------------------------------------

    def _register(self) -> None:
        s = self.settings
        creds = credentials.load(s.token_file, s.server_url)
        if creds is None:
            if not s.registration_token:
                raise SystemExit(
                    f"no worker token in {s.token_file} and no --registration-token given"
                )
            anonymous = self._new_client(None)
            try:
                answer = self._retry(
                    "register",
                    lambda: anonymous.register_worker(
                        s.registration_token or "",
                        name=s.name or socket.gethostname(),
                        gpu_type=s.gpu_type,
                        gpu_count=s.gpu_count,
                        price_per_hour=s.price_per_hour,
                        models=[s.model],
                    ),
                )
            finally:
                anonymous.close()
            creds = credentials.Credentials(str(answer["id"]), answer["token"], s.server_url)
            credentials.save(s.token_file, creds)
            log.info("registered as worker %s", creds.worker_id)
        self.worker_id = creds.worker_id
        self.client = self._new_client(creds.token)

    # -- polling --------------------------------------------------------------------------------

    def _serve(self) -> None:
        s = self.settings
        idle = Backoff(s.idle_backoff_min_s, s.idle_backoff_max_s)
        assert self.client is not None
        client = self.client
        while not self.stop_event.is_set():
            if s.max_leases is not None and len(self.history) >= s.max_leases:
                return
            lease = self._retry(
                "acquire",
                lambda: client.acquire_lease(
                    models=[s.model], wait_s=s.acquire_wait_s, timeout_s=s.http_timeout_s
                ),
            )
            if lease is None:
                self._sleep(idle.next_delay())
                continue
            record = self.process(lease)
            self.history.append(record)
            log.info("lease %s: %s %s", record.lease_id, record.outcome, record.reason or "")
            if record.engine_fault is not None:
                self._restart_engine(record.engine_fault)
            if record.outcome == Outcome.released:
                self._sleep(idle.next_delay())  # a lease we cannot serve: do not spin on it
            else:
                idle.reset()

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

    # -- one lease ------------------------------------------------------------------------------

    def process(self, lease: Lease) -> LeaseRecord:
        """Generate, upload and complete one lease; never raises for a lost lease."""
        record = LeaseRecord(lease.lease_id, lease.run_id, lease.adapter_version, Outcome.lost)
        refusal = self._refusal(lease)
        if refusal is not None:
            record.outcome, record.reason = self._give_back(lease, "unservable"), refusal
            return record
        self._current, self._cancel = lease, threading.Event()
        if self.stop_event.is_set():
            self._cancel.set()
        assert self.client is not None
        hb_client = self._new_client(self.client.token, max_retries=0)
        beat = Heartbeat(
            hb_client,
            lease,
            interval_s=lease.heartbeat_interval_s,
            ttl_s=lease.ttl_s,
            cancel=self._cancel,
        ).start()
        try:
            self._produce(lease, record)
        except (AdapterMismatch, ChecksumMismatch) as exc:
            log.error(
                "lease %s: adapter v%d refused: %s", lease.lease_id, lease.adapter_version, exc
            )
            record.outcome = self._give_back(lease, "adapter_invalid")
            record.reason = f"adapter_invalid: {exc}"
        except EngineFault as exc:
            log.error("lease %s: the engine died: %s", lease.lease_id, exc)
            record.outcome = self._give_back(lease, "engine_fault")
            record.reason = f"engine_fault: {exc}"
            record.engine_fault = str(exc)
        except (GenerationCancelled, LeaseLost, ConflictError, NotFoundError) as exc:
            record.outcome = Outcome.lost
            record.reason = beat.lost_reason or type(exc).__name__
            if self.stop_event.is_set() and beat.lost_reason is None:
                record.outcome = self._give_back(lease, "shutdown")
                record.reason = "shutdown"
        finally:
            beat.stop()
            hb_client.close()
            self._current = None
        return record

    def _refusal(self, lease: Lease) -> str | None:
        """Why this worker cannot serve the lease (model or tokenizer mismatch), or None."""
        if lease.base_model != self.settings.model:
            return f"base model {lease.base_model!r} is not served here"
        if lease.tokenizer_fingerprint not in (None, self.fingerprint):
            return "tokenizer fingerprint mismatch"
        return None

    def _give_back(self, lease: Lease, reason: ReleaseReason) -> Outcome:
        log.info("releasing lease %s: %s", lease.lease_id, reason)
        return Outcome.released if self._release(lease, reason) else Outcome.stopped

    def _release(self, lease: Lease, reason: ReleaseReason, timeout_s: float | None = None) -> bool:
        """Release once (fenced); True when the server took the prompts back."""
        with self._release_lock:
            if lease.lease_id in self._released:
                return True
            client = self._new_client(self.client.token if self.client else None, max_retries=1)
            try:
                client.release_lease(lease, reason=reason, timeout_s=timeout_s or 3.0)
            except LOST:
                return False  # already ended (expired, aborted, completed)
            except (ApiError, httpx.HTTPError) as exc:
                log.warning("release of lease %s failed: %r", lease.lease_id, exc)
                return False
            finally:
                client.close()
            self._released.add(lease.lease_id)
            return True

    def release_current(self, reason: str, timeout_s: float | None = None) -> None:
        """Release the lease being worked on, if any (safe from another thread)."""
        lease = self._current
        if lease is not None:
            self._cancel.set()
            log.info("releasing lease %s: %s", lease.lease_id, reason)
            self._release(lease, "shutdown", timeout_s=timeout_s or self.settings.shutdown_grace_s)

    def _produce(self, lease: Lease, record: LeaseRecord) -> None:
        started = time.monotonic()
        handle = self._retry(
            "adapter download",
            lambda: self.adapters.ensure(str(lease.run_id), lease.adapter_version, lease.adapter),
            lease=True,
        )
        prompts = self.encoder.encode(lease.prompts, lease.system_prompt)
        sampling = SamplingSpec(
            temperature=float(lease.sampling.get("temperature", 1.0)),
            max_new_tokens=lease.max_new_tokens,
            seed=lease.seed,
        )
        completions = self.backend.generate(
            prompts, lease.group_size, sampling, handle, self._cancel
        )
        record.generation_seconds = time.monotonic() - started
        if self._cancel.is_set():
            raise GenerationCancelled()
        path, info = self._write(lease, prompts, completions)
        try:
            self._upload_and_complete(lease, path, info, record)
        finally:
            path.unlink(missing_ok=True)

    def _write(
        self, lease: Lease, prompts: list[list[int]], completions: list[Completion]
    ) -> tuple[Path, BatchFileInfo]:
        metadata = BatchMetadata(
            run_id=str(lease.run_id),
            lease_id=str(lease.lease_id),
            fencing=lease.fencing,
            worker_id=str(self.worker_id),
            adapter_version=lease.adapter_version,
            adapter_sha256=lease.adapter.sha256 if lease.adapter else None,
            tokenizer_fingerprint=self.fingerprint,
            sampling=dict(lease.sampling),
        )
        samples = [
            RolloutSample(
                prompt_row_id=lease.prompts[c.prompt_index].prompt_row_id,
                group_index=c.group_index,
                prompt_token_ids=prompts[c.prompt_index],
                completion_token_ids=c.token_ids,
                behaviour_logprobs=c.logprobs,
                finish_reason=c.finish_reason,
            )
            for c in completions
        ]
        path = self.settings.work_dir / f"{lease.lease_id}-{lease.fencing}.parquet"
        return path, write_batch(path, metadata, samples)

    def _upload_and_complete(
        self, lease: Lease, path: Path, info: BatchFileInfo, record: LeaseRecord
    ) -> None:
        assert self.client is not None
        client = self.client

        def upload() -> str:
            answer = client.upload_url(lease, size=info.bytes, sha256=info.sha256)
            try:
                upload_presigned(PresignedPut(answer.url, answer.headers), path)
            except ObjectExists:
                pass  # an earlier try landed; the server checks size on complete
            return answer.key

        key = self._retry("upload", upload, lease=True)
        if self._cancel.is_set():
            raise LeaseLost("lease ended before complete")
        manifest = BatchManifest(
            key=key,
            sha256=info.sha256,
            size=info.bytes,
            n_samples=info.n_samples,
            n_tokens=info.n_tokens,
            generation_seconds=record.generation_seconds,
        )
        answer = self._retry("complete", lambda: client.complete_lease(lease, manifest))
        record.outcome = Outcome(answer.state)
        record.reason = answer.reject_reason
        record.n_samples, record.n_tokens = info.n_samples, info.n_tokens
