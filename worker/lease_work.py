"""One held lease, in its own thread: adapter ready → generate (on the shared engine, beside the
other held leases) → write the batch → upload → complete. Never raises for a lost lease: every
way a lease can end is an `Outcome` in its `LeaseRecord`.

A single_turn run's lease is generated in one `Backend.generate` call and written as a format 1
batch (as before environments); any other environment's lease is rolled out by
worker/rollouts.py and written as a format 2 (trajectory) batch."""

from __future__ import annotations

import enum
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from protocol.adapters import AdapterMismatch
from protocol.batches import (
    BatchFileInfo,
    BatchMetadata,
    RolloutSample,
    write_batch,
    write_trajectory_batch,
)
from protocol.client import ApiError, AsyncGrpoClient
from protocol.schemas import BatchManifest, Lease, ReleaseReason
from protocol.storage import ObjectExists, PresignedPut
from protocol.transfer import ChecksumMismatch, upload_presigned
from worker.backends.base import Backend, Completion, EngineFault, GenerationCancelled, SamplingSpec
from worker.config import WorkerSettings
from worker.engine import EngineGuard
from worker.environments.base import EnvironmentSetupError
from worker.held import HeldLease
from worker.prompts import PromptEncoder
from worker.retry import LeaseLost, retry
from worker.rollouts import (
    EnvironmentRollouts,
    PromptsTooLong,
    RolloutFailed,
    environment_of,
    is_multi_turn,
)
from worker.versions import AdapterLoads

log = logging.getLogger(__name__)
T = TypeVar("T")


class Outcome(enum.StrEnum):
    accepted = "accepted"
    rejected = "rejected"
    lost = "lost"  # 409/404, abort, or expiry: the work was dropped
    released = "released"  # given back (shutdown, or a lease this worker cannot serve)
    stopped = "stopped"  # shutdown while the release itself failed


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
    adapter_preloaded: bool = False  # its version's load was started by a push, not by it
    adapter_wait_s: float = 0.0  # how long it waited for its version to be ready


@dataclass
class LeaseWork:
    """What a lease thread needs from the worker."""

    settings: WorkerSettings
    backend: Backend
    encoder: PromptEncoder
    fingerprint: str
    worker_id: str
    new_client: Callable[..., AsyncGrpoClient]
    loads: AdapterLoads
    guard: EngineGuard
    stop: threading.Event
    generated: Callable[[HeldLease], None]  # the lease's sequences have left the engine
    rollouts: EnvironmentRollouts | None = None  # multi-turn leases (None: single_turn only)

    def _retry(self, what: str, call: Callable[[], T], held: HeldLease | None = None) -> T:
        cancel = held.cancel if held is not None else None
        return retry(what, call, stop=self.stop, cap_s=self.settings.retry_max_s, cancel=cancel)

    # -- giving a lease back --------------------------------------------------------------------

    def give_back(self, held: HeldLease, reason: ReleaseReason) -> Outcome:
        log.info("releasing lease %s: %s", held.lease_id, reason)
        return Outcome.released if self.release(held, reason) else Outcome.stopped

    def release(
        self,
        held: HeldLease,
        reason: ReleaseReason,
        timeout_s: float = 3.0,
        prompt_row_ids: list[int] | None = None,
    ) -> bool:
        """Release once (fenced); True when the server took the prompts back."""
        with held.release_lock:
            if held.released:
                return True
            client = self.new_client(max_retries=1)
            try:
                client.release_lease(
                    held.lease, reason=reason, timeout_s=timeout_s, prompt_row_ids=prompt_row_ids
                )
            except (ApiError, httpx.HTTPError) as exc:
                if isinstance(exc, ApiError) and exc.lease_lost:
                    return False  # already ended (expired, aborted, completed)
                log.warning("release of lease %s failed: %r", held.lease_id, exc)
                return False
            finally:
                client.close()
            held.released = True
            return True

    # -- one lease ------------------------------------------------------------------------------

    def run(self, held: HeldLease, record: LeaseRecord) -> None:
        """Generate, upload and complete the lease, filling `record`; never raises for a lost
        lease (an engine that must not be restarted again raises EngineFailing)."""
        lease = held.lease
        fault: tuple[bool, EngineFault] | None = None
        try:
            fault = self._produce(held, record)
        except (AdapterMismatch, ChecksumMismatch) as exc:
            log.error(
                "lease %s: adapter v%d refused: %s", lease.lease_id, lease.adapter_version, exc
            )
            record.outcome = self.give_back(held, "adapter_invalid")
            record.reason = f"adapter_invalid: {exc}"
        except EnvironmentSetupError as exc:
            log.error("lease %s: cannot run its environment here: %s", lease.lease_id, exc)
            record.outcome = self.give_back(held, "unservable")
            record.reason = f"unservable: {exc}"
        except RolloutFailed as exc:
            record.outcome = self.give_back(held, "environment_error")
            record.reason = f"environment_error: {exc}"
        except PromptsTooLong as exc:
            log.warning("lease %s: %s", lease.lease_id, exc)
            released = self.release(held, "prompt_too_long", prompt_row_ids=exc.prompt_row_ids)
            record.outcome = Outcome.released if released else Outcome.stopped
            record.reason = f"prompt_too_long: {exc}"
        except (GenerationCancelled, LeaseLost) as exc:
            self._lost(held, record, type(exc).__name__)
        except ApiError as exc:
            if not exc.lease_lost:
                raise
            self._lost(held, record, str(exc.code))
        if fault is not None:
            first, died = fault
            log.error("lease %s: the engine died: %s", lease.lease_id, died)
            try:
                record.outcome = self.give_back(held, "engine_fault")
                record.reason = f"engine_fault: {died}"
                record.engine_fault = str(died)
            finally:
                if first:  # the guard closed at the death; this lease restarts the engine
                    self.guard.reopen(str(died))

    def _lost(self, held: HeldLease, record: LeaseRecord, why: str) -> None:
        record.reason = held.lost_reason or why
        if self.stop.is_set() and held.lost_reason is None:
            record.outcome = self.give_back(held, "shutdown")
            record.reason = "shutdown"

    def _produce(self, held: HeldLease, record: LeaseRecord) -> tuple[bool, EngineFault] | None:
        """The lease's work; an engine death closes the guard at once and is returned (with
        whether this lease saw it first and so restarts the engine) so that the lease is
        released before the engine restarts."""
        lease = held.lease
        started = time.monotonic()
        try:
            handle, record.adapter_preloaded = self._retry(
                "adapter download",
                lambda: self.loads.ready(
                    str(lease.run_id), lease.adapter_version, lease.adapter, held.cancel
                ),
                held,
            )
        except EngineFault as exc:  # the engine died loading the version
            self.generated(held)
            return self.guard.close(self.guard.epoch), exc
        record.adapter_wait_s = time.monotonic() - started
        if held.cancel.is_set():
            raise GenerationCancelled()
        if is_multi_turn(lease):
            return self._produce_trajectories(held, record, handle, started)
        prompts = self.encoder.encode(lease.prompts, lease.system_prompt)
        sampling = SamplingSpec(
            temperature=float(lease.sampling.get("temperature", 1.0)),
            max_new_tokens=lease.max_new_tokens,
            seed=lease.seed,
        )
        log.info("lease %s generating with run=%s v%d", lease.lease_id, lease.run_id,
                 lease.adapter_version)  # fmt: skip
        try:
            with self.guard.generating() as epoch:
                try:
                    completions = self.backend.generate(
                        prompts, lease.group_size, sampling, handle, held.cancel
                    )
                except EngineFault as exc:
                    return self.guard.close(epoch), exc
        finally:
            self.generated(held)
        record.generation_seconds = time.monotonic() - started
        if held.cancel.is_set():
            raise GenerationCancelled()
        path, info = self._write(lease, prompts, completions)
        try:
            self._upload_and_complete(held, path, info, record)
        finally:
            path.unlink(missing_ok=True)
        return None

    def _produce_trajectories(
        self, held: HeldLease, record: LeaseRecord, handle: Any, started: float
    ) -> tuple[bool, EngineFault] | None:
        """The environment's rollouts of every prompt × G, written as a format 2 batch."""
        lease = held.lease
        if self.rollouts is None:
            raise EnvironmentSetupError("this worker runs single_turn leases only")
        log.info("lease %s rolling out %s with run=%s v%d", lease.lease_id,
                 environment_of(lease).name, lease.run_id, lease.adapter_version)  # fmt: skip
        try:
            with self.guard.generating() as epoch:
                try:
                    samples = self.rollouts.rollout(lease, handle, held.cancel)
                except EngineFault as exc:
                    return self.guard.close(epoch), exc
        finally:
            self.generated(held)
        record.generation_seconds = time.monotonic() - started
        if held.cancel.is_set():
            raise GenerationCancelled()
        path = self._path(lease)
        info = write_trajectory_batch(path, self._metadata(lease, trajectories=True), samples)
        try:
            self._upload_and_complete(held, path, info, record)
        finally:
            path.unlink(missing_ok=True)
        return None

    def _path(self, lease: Lease) -> Path:
        return self.settings.work_dir / f"{lease.lease_id}-{lease.fencing}.parquet"

    def _metadata(self, lease: Lease, *, trajectories: bool = False) -> BatchMetadata:
        return BatchMetadata(
            format_version=2 if trajectories else 1,
            run_id=str(lease.run_id),
            lease_id=str(lease.lease_id),
            fencing=lease.fencing,
            worker_id=self.worker_id,
            adapter_version=lease.adapter_version,
            adapter_sha256=lease.adapter.sha256 if lease.adapter else None,
            tokenizer_fingerprint=self.fingerprint,
            sampling=dict(lease.sampling),
            kind=lease.kind,
            environment=environment_of(lease).model_dump(mode="json") if trajectories else None,
        )

    def _write(
        self, lease: Lease, prompts: list[list[int]], completions: list[Completion]
    ) -> tuple[Path, BatchFileInfo]:
        metadata = self._metadata(lease)
        # an eval batch is only scored: it carries no behaviour log-probs
        samples = [
            RolloutSample(
                prompt_row_id=lease.prompts[c.prompt_index].prompt_row_id,
                group_index=c.group_index,
                prompt_token_ids=prompts[c.prompt_index],
                completion_token_ids=c.token_ids,
                behaviour_logprobs=None if lease.kind == "eval" else c.logprobs,
                finish_reason=c.finish_reason,
            )
            for c in completions
        ]
        path = self._path(lease)
        return path, write_batch(path, metadata, samples)

    def _upload_and_complete(
        self, held: HeldLease, path: Path, info: BatchFileInfo, record: LeaseRecord
    ) -> None:
        lease = held.lease
        client = self.new_client()
        try:

            def upload() -> str:
                answer = client.upload_url(lease, size=info.bytes, sha256=info.sha256)
                try:
                    upload_presigned(PresignedPut(answer.url, answer.headers), path)
                except ObjectExists:
                    pass  # an earlier try landed; the server checks size on complete
                return answer.key

            key = self._retry("upload", upload, held)
            if held.cancel.is_set():
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
        finally:
            client.close()
        record.outcome = Outcome(answer.state)
        record.reason = answer.reject_reason
        record.n_samples, record.n_tokens = info.n_samples, info.n_tokens
