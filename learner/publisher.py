"""Publishing one adapter version from a snapshot (docs/architecture/learner.md, "The learner"): the
weights (and, on checkpoint versions, the optimizer state) are copied when the version is
handed over, so the files, upload and publish call can run on the publish thread while the
next step trains. Exactly-once holds as before: the version is published by one compare-and-set
call naming the batches trained into it; a kill before that call leaves nothing published."""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learner.checkpoint import CapturedState, write_state
from learner.transfers import Retrier, transient_api, upload_version_files
from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient
from protocol.storage import sha256_file

log = logging.getLogger(__name__)


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

    def __call__(self, job: PublishJob) -> Published:
        from lm.adapter_io import save_adapter_version

        out = self.work_dir / f"v{job.version:06d}"
        if out.exists():
            shutil.rmtree(out)
        manifest = save_adapter_version(
            self.model, out / "adapter", state_dict=job.weights, base_model=self.base_model
        )
        files: list[tuple[Path, str]] = [
            (out / "adapter" / f.name, "adapter") for f in manifest.files
        ]
        if job.checkpoint is not None:
            files += [(p, "checkpoint") for p in write_state(out / "checkpoint", job.checkpoint)]
        # known before the publish lands, so a batch of this version claimed at once is
        # checked against it (a version that never lands leaves a harmless entry)
        self.adapter_sha256[job.version] = manifest.version_sha256()
        published = upload_files(
            self.retrier, self.client, (self.run_id, self.fencing, job.version), files
        )
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
        # a 5xx (the server's own bucket check failing) is retried; a publish that landed
        # but whose answer was lost answers 409 on the retry: re-attach resumes from it
        result = self.retrier.call(
            f"publish of version {job.version}",
            lambda: self.client.publish_adapter(self.run_id, body),
            transient_api,
        )
        checkpoint = " with its checkpoint" if job.checkpoint is not None else ""
        log.info("published version %d%s (%s)", job.version, checkpoint, result.run_status)
        shutil.rmtree(out, ignore_errors=True)
        return Published(job.version, result.run_status)


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
