"""Publishing one adapter version from a snapshot (docs/architecture/learner.md, "The learner"): the
weights (and, on checkpoint versions, the optimizer state) are copied when the version is
handed over, so the files, upload and publish call can run on the publish thread while the
next step trains. Exactly-once holds as before: the version is published by one compare-and-set
call naming the batches trained into it; a kill before that call leaves nothing published."""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learner.checkpoint import CapturedState, write_state
from learner.refusals import Call, Diverged, OnConflict, landed_version, on_409
from learner.transfers import Retrier, transient_api, upload_version_files
from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient, ConflictError
from protocol.idempotency import new_key
from protocol.storage import sha256_file

log = logging.getLogger(__name__)
REUPLOADS = 3  # a file the bucket lacks at publish, uploaded again at most this often


@dataclass
class PublishJob:
    version: int
    weights: dict[str, Any]  # trainable parameters by name (CPU copies)
    checkpoint: CapturedState | None  # the resume state, on checkpoint versions only
    consumed: list[uuid.UUID]
    learner_step: int
    metrics: dict[str, float | int | None]
    final: bool


@dataclass(frozen=True)
class Published:
    version: int
    run_status: str


@dataclass
class Publisher:
    client: AsyncGrpoClient
    retrier: Retrier
    run_id: str
    fencing: int
    model: Any  # the PEFT model: its adapter config is written beside the snapshot
    work_dir: Path
    adapter_sha256: dict[int, str | None]  # the intake's table of known version hashes
    base_model: str | None = None  # the run's: adapter_config.json names it, not a local path
    adapter_name: str = "default"  # the run's adapter in the model (a pool learner's: its own)
    # where the model may be read: a pool learner's runs take turns on one model
    turn: Callable[[], AbstractContextManager[None]] = nullcontext

    def __call__(self, job: PublishJob) -> Published:
        from lm.adapter_io import save_adapter_version

        out = self.work_dir / f"v{job.version:06d}"
        if out.exists():
            shutil.rmtree(out)
        with self.turn():
            manifest = save_adapter_version(
                self.model,
                out / "adapter",
                state_dict=job.weights,
                base_model=self.base_model,
                adapter_name=self.adapter_name,
            )
        files: list[tuple[Path, str]] = [
            (out / "adapter" / f.name, "adapter") for f in manifest.files
        ]
        if job.checkpoint is not None:
            files += [(p, "checkpoint") for p in write_state(out / "checkpoint", job.checkpoint)]
        # known before the publish lands, so a batch of this version claimed at once is
        # checked against it (a version that never lands leaves a harmless entry)
        sha256 = self.adapter_sha256[job.version] = manifest.version_sha256()
        result = self._upload_and_publish(job, files, sha256)
        checkpoint = " with its checkpoint" if job.checkpoint is not None else ""
        log.info("published version %d%s (%s)", job.version, checkpoint, result.run_status)
        shutil.rmtree(out, ignore_errors=True)
        return result

    def _upload_and_publish(
        self, job: PublishJob, files: list[tuple[Path, str]], sha256: str
    ) -> Published:
        """Upload, then publish; each 409 handled by its code (learner/refusals.py): a
        `version_not_next` is reconciled (our publish landed, its answer lost: taken as
        published; else Diverged), a file the bucket lacks is uploaded again (at most
        REUPLOADS times in all)."""
        ids = (self.run_id, self.fencing, job.version)
        to_upload, published = files, _no_files()
        for _ in range(REUPLOADS + 1):
            try:
                fresh = upload_files(self.retrier, self.client, ids, to_upload)
            except ConflictError as exc:
                return self._after_409("uploads", exc, job, sha256)
            published = _merge(published, fresh)
            try:
                answer = self._publish(job, published)
            except ConflictError as exc:
                if on_409("publish", exc) is not OnConflict.re_upload:
                    return self._after_409("publish", exc, job, sha256)
                to_upload = _named(files, published, exc)
                log.warning(
                    "re-uploading %s of version %d (%s)", exc.body["key"], job.version, exc.code
                )
                continue
            return Published(job.version, answer.run_status)
        raise RuntimeError(
            f"version {job.version}: a file still missing after {REUPLOADS} re-uploads"
        )

    def _after_409(self, call: Call, exc: ConflictError, job: PublishJob, sha256: str) -> Published:
        """Reconcile a `version_not_next`, raise Diverged or the refusal itself (a lost lease
        ends the session; an unexpected code is raised)."""
        action = on_409(call, exc)
        if action is OnConflict.reconcile:
            status = landed_version(exc, job.version, sha256)
            log.warning(
                "version %d had landed (its answer was lost): taken as published", job.version
            )
            return Published(job.version, status)
        if action is OnConflict.diverged:
            raise Diverged(f"publish of version {job.version}: {exc.detail}") from exc
        raise exc

    def _publish(
        self, job: PublishJob, published: dict[str, list[sl.PublishedFile]]
    ) -> sl.PublishResponse:
        body = sl.PublishRequest(
            fencing=self.fencing,
            version=job.version,
            files=published["adapter"],
            checkpoint_files=published["checkpoint"],
            learner_step=job.learner_step,
            metrics=job.metrics,
            consumed_batch_ids=job.consumed,
            final=job.final,
        )
        # A 5xx (the server's own bucket check failing) or an answer lost past the client's
        # own retries is retried under the same key: a publish that landed gets its stored
        # answer, even the final one, after which the lease is gone (a new key would be refused
        # the lease), so the retry goes on after the heartbeat's 409 (Retrier.call_keyed).
        # Past the key's retention, version_not_next is reconciled (above).
        key = new_key()
        return self.retrier.call_keyed(
            f"publish of version {job.version}",
            lambda: self.client.publish_adapter(self.run_id, body, idempotency_key=key),
            transient_api,
        )


def _no_files() -> dict[str, list[sl.PublishedFile]]:
    return {"adapter": [], "checkpoint": []}


def _merge(
    published: dict[str, list[sl.PublishedFile]], fresh: dict[str, list[sl.PublishedFile]]
) -> dict[str, list[sl.PublishedFile]]:
    """The published files with the freshly uploaded ones in place of their namesakes."""
    out = _no_files()
    for kind in out:
        new = {f.name: f for f in fresh[kind]}
        out[kind] = [new.pop(f.name, f) for f in published[kind]] + list(new.values())
    return out


def _named(
    files: list[tuple[Path, str]], published: dict[str, list[sl.PublishedFile]], exc: ConflictError
) -> list[tuple[Path, str]]:
    """The file a file_not_uploaded / file_size_mismatch answer names (by its `key`)."""
    key = exc.body.get("key") if isinstance(exc.body, dict) else None
    names = {(kind, f.name) for kind, listed in published.items() for f in listed if f.key == key}
    named = [(p, kind) for p, kind in files if (kind, p.name) in names]
    if not named:
        raise exc
    return named


def upload_files(
    retrier: Retrier,
    client: AsyncGrpoClient,
    version: tuple[str, int, int],
    files: list[tuple[Path, str]],
) -> dict[str, list[sl.PublishedFile]]:
    """Upload one version's files ((path, kind): `adapter` or `checkpoint`) for `version`
    (run id, fencing, version number); what the publish call names, by kind."""
    run_id, fencing, number = version
    uploads = [
        sl.UploadFile(name=p.name, size=p.stat().st_size, sha256=sha256_file(p), kind=kind)  # type: ignore[arg-type]
        for p, kind in files
    ]
    request = sl.UploadsRequest(fencing=fencing, version=number, files=uploads)
    keys = upload_version_files(
        retrier, client, run_id, request, {(k, p.name): p for p, k in files}
    )
    published: dict[str, list[sl.PublishedFile]] = {"adapter": [], "checkpoint": []}
    for u in uploads:
        published[u.kind].append(
            sl.PublishedFile(name=u.name, key=keys[(u.kind, u.name)], sha256=u.sha256, size=u.size)
        )
    return published
