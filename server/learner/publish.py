"""Adapter versions (invariants 7 and 8): presigned conditional uploads for version N+1, and
the publish that registers it — strictly +1, under the current learner token, every object
present with its stated size, and the batches it was trained on consumed in the same
transaction. A final publish (or reaching max_versions) completes the run."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy.orm import Session

from protocol import layout
from protocol.adapters import AdapterManifest
from protocol.error_codes import ErrorCode
from protocol.schemas_learner import (
    PresignedUpload,
    PublishedFile,
    PublishRequest,
    PublishResponse,
    UploadsRequest,
    UploadsResponse,
)
from protocol.storage import ObjectStore
from server.config import Settings
from server.errors import Conflict, FencingLost, Unprocessable
from server.evals import service as evals
from server.events.service import raise_event
from server.learner import repository as repo
from server.learner.service import authorize, fence, run_config
from server.leases import queue
from server.models import Token
from server.runs import best, lifecycle
from server.wakeups import LEARNER, after_commit

REQUIRED_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def _key(run_id: uuid.UUID, version: int, kind: str, name: str) -> str:
    try:
        if kind == "adapter":
            return layout.adapter_key(run_id, version, name)
        return layout.checkpoint_key(run_id, version, name)
    except ValueError as exc:
        raise Unprocessable(str(exc), field="name", code=ErrorCode.invalid_value) from exc


def _next_version(session: Session, run: repo.FencedRun, version: int) -> None:
    """409 unless `version` is the current version + 1. The answer names the current version,
    the run's status and, when `version` is already published, its sha256: the fence held in
    this transaction, so the learner can tell its own publish whose answer was lost from a
    history that is not its own (docs/architecture/learner.md, "Refusals by code")."""
    current = run.current_version
    if version == current + 1:
        return
    landed = repo.adapter_version(session, run.id, version) if version <= current else None
    raise Conflict(
        f"version must be exactly current_version + 1 = {current + 1}, got {version}",
        current_version=current,
        run_status=run.status,
        version_sha256=None if landed is None else landed.sha256,
        code=ErrorCode.version_not_next,
    )


def uploads(
    session: Session,
    store: ObjectStore,
    settings: Settings,
    token: Token,
    run_id: uuid.UUID,
    body: UploadsRequest,
) -> UploadsResponse:
    """Presigned PUTs (If-None-Match: * signed in) for version N+1's files.

    Version N+1 is not registered yet, so an object already at one of the requested keys is
    the leftover of an unpublished attempt (this learner's retry, or a fenced-out learner's
    late upload): it is removed so that the conditional put can land."""
    run = fence(session, settings, token, run_id, body.fencing)
    _next_version(session, run, body.version)
    seen: set[tuple[str, str]] = set()
    out = []
    for f in body.files:
        if (f.kind, f.name) in seen:
            raise Unprocessable(
                f"file {f.name!r} listed twice", field="files", code=ErrorCode.duplicate_file
            )
        seen.add((f.kind, f.name))
        key = _key(run_id, body.version, f.kind, f.name)
        if store.head(key) is not None:
            store.delete(key)
        put = store.presign_put(
            key,
            size=f.size,
            sha256_hex=f.sha256,
            ttl_s=settings.security.url_ttl_s,
            if_none_match=True,
        )
        out.append(
            PresignedUpload(name=f.name, kind=f.kind, key=key, url=put.url, headers=put.headers)
        )
    return UploadsResponse(uploads=out)


def _file_table(
    store: ObjectStore, run_id: uuid.UUID, version: int, kind: str, files: Sequence[PublishedFile]
) -> dict[str, dict[str, object]]:
    """Validated {name: {key, sha256, bytes}}: the keys this version owns, each object present
    in the store with the stated size."""
    table: dict[str, dict[str, object]] = {}
    for f in files:
        if f.name in table:
            raise Unprocessable(
                f"{kind} file {f.name!r} listed twice",
                field=f"{kind}_files",
                code=ErrorCode.duplicate_file,
            )
        expected = _key(run_id, version, kind, f.name)
        if f.key != expected:
            raise Unprocessable(
                f"{kind} file {f.name!r} must be at {expected}",
                field="key",
                code=ErrorCode.wrong_file_key,
            )
        info = store.head(f.key)
        if info is None:
            raise Conflict(
                f"{f.key} is not in the store: upload before publishing",
                key=f.key,
                code=ErrorCode.file_not_uploaded,
            )
        if info.size != f.size:
            raise Conflict(
                f"{f.key} has {info.size} bytes, the publish says {f.size}",
                key=f.key,
                code=ErrorCode.file_size_mismatch,
            )
        table[f.name] = {"key": f.key, "sha256": f.sha256, "bytes": f.size}
    return table


def _check_consumable(
    session: Session, run_id: uuid.UUID, batch_ids: list[uuid.UUID], fencing: int, version: int
) -> None:
    """Every batch claimed under this token for this version or a later one: a batch may land
    earlier than its claim planned, never later, which would train it further behind than the
    window allowed at claim (invariant 5). 409 naming the batches otherwise."""
    held = repo.claimed_targets(session, run_id, batch_ids, fencing)
    if len(held) != len(batch_ids):
        unknown = sorted(str(b) for b in batch_ids if b not in held)
        raise Conflict(
            "batches not claimed under this fencing token",
            batch_ids=unknown,
            code=ErrorCode.batch_not_claimed,
        )
    late = sorted(str(b) for b, target in held.items() if target is not None and target < version)
    if late:
        raise Conflict(
            f"batches claimed for a version before {version}: consumed into {version} they "
            "would be trained further behind than the staleness window allowed at claim",
            batch_ids=late,
            code=ErrorCode.batch_claimed_for_earlier_version,
        )


def publish(
    session: Session,
    store: ObjectStore,
    settings: Settings,
    token: Token,
    run_id: uuid.UUID,
    body: PublishRequest,
) -> PublishResponse:
    authorize(session, token, run_id)
    missing = [n for n in REQUIRED_ADAPTER_FILES if n not in {f.name for f in body.files}]
    if missing:
        raise Unprocessable(
            f"adapter files missing: {', '.join(missing)}",
            field="files",
            code=ErrorCode.adapter_files_missing,
        )
    run = fence(session, settings, token, run_id, body.fencing)
    _next_version(session, run, body.version)
    files = _file_table(store, run_id, body.version, "adapter", body.files)
    checkpoint = _file_table(store, run_id, body.version, "checkpoint", body.checkpoint_files)
    batch_ids = list(dict.fromkeys(body.consumed_batch_ids))
    _check_consumable(session, run_id, batch_ids, body.fencing, body.version)
    if not repo.advance_version(session, run_id, body.fencing, body.version):
        raise FencingLost(
            "the run's version or learner lease changed: re-attach", code=ErrorCode.fencing_lost
        )
    config = run_config(session, run_id)
    final = body.final or (config.max_versions is not None and body.version >= config.max_versions)
    repo.insert_adapter_version(
        session,
        run_id=run_id,
        version=body.version,
        files=files,
        checkpoint_files=checkpoint,
        sha256=AdapterManifest.from_json(files).version_sha256(),  # type: ignore[arg-type]
        bytes=sum(int(str(m["bytes"])) for m in files.values()),
        learner_step=body.learner_step,
        metrics=body.metrics,
        final=final,
    )
    consumed = repo.mark_consumed(session, batch_ids, body.version)
    queue.consume(session, run_id, batch_ids, body.version)
    after_commit(session, LEARNER)  # a claim for this version ends (409), even with none consumed
    status = run.status
    if config.eval is not None:
        status = evals.on_publish(session, run_id, config, body.version, final) or status
    elif final:
        lifecycle.complete(
            session, run_id, "final version published" if body.final else "max_versions reached"
        )
        status = "completed"
    figure = best.train_figure(session, run_id, body.version, config)
    if best.rank(session, run_id, body.version, figure, config):
        status = "completed"
    raise_event(
        session,
        kind="version.published",
        severity="info",
        message=f"version {body.version} published ({consumed} batches consumed)"
        + (f"; the run is {status}" if final else ""),
        run_id=run_id,
        data={"version": body.version, "final": final},
    )
    return PublishResponse(version=body.version, run_status=status, consumed_batches=consumed)
