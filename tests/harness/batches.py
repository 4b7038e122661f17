"""Batch factories: what acquire + upload + complete leave behind, made directly in the app's
database and store. `accepted_batch` stores a stand-in object (for the server's own tests);
`real_batch` a real Parquet batch (protocol/batches.py) of the run's prompts, tokenized as a
worker would, that the real learner trains on."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from protocol.batches import BatchFileInfo, BatchMetadata, RolloutSample, write_batch
from protocol.layout import batch_key
from protocol.run_config import RunConfig
from server.db import transaction
from server.models import AdapterVersion, DatasetRow, Lease, PromptRow, RolloutBatch, Run

FP = "tok-fp-1"  # the tokenizer fingerprint of a stand-in batch

Scorer = Callable[[list[int], list[int]], list[float]]


def next_fencing(session: Any, run_id: uuid.UUID) -> int:
    """A fencing token for a lease made by hand: the run's next one, as a grant takes it."""
    return int(
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(fencing_seq=Run.fencing_seq + 1)
            .returning(Run.fencing_seq)
        ).scalar_one()
    )


def queued_rows(session: Any, run_id: uuid.UUID, limit: int | None) -> list[PromptRow]:
    """The front `limit` queued prompt rows of the run (all of them: None)."""
    query = (
        select(PromptRow)
        .where(PromptRow.run_id == run_id, PromptRow.state == "queued")
        .order_by(PromptRow.queue_pos)
    )
    return list(session.execute(query if limit is None else query.limit(limit)).scalars())


def completed_lease(
    session: Any, run: Run, worker_id: uuid.UUID, version: int, rows: list[Any], group_size: int
) -> Lease:
    """A completed lease of `rows`, with the run's next fencing token (flushed: it has an id)."""
    lease = Lease(
        run_id=run.id,
        worker_id=worker_id,
        adapter_version=version,
        fencing=next_fencing(session, run.id),
        state="completed",
        expires_at=run.created_at,
        seed=1,
        n_prompts=len(rows),
        group_size=group_size,
    )
    session.add(lease)
    session.flush()
    return lease


def record_accepted(
    session: Any, run_id: uuid.UUID, lease_id: uuid.UUID, batch: RolloutBatch, rows: list[Any]
) -> uuid.UUID:
    """Store an accepted batch as `complete` leaves it: its rows accepted and in flight."""
    session.add(batch)
    session.flush()
    session.execute(
        update(PromptRow)
        .where(PromptRow.id.in_([r.id for r in rows]))
        .values(state="accepted", lease_id=lease_id, batch_id=batch.id)
    )
    session.execute(
        update(Run)
        .where(Run.id == run_id)
        .values(groups_in_flight=Run.groups_in_flight + len(rows))
    )
    return batch.id


def accept_batch_file(
    app: Any,
    session: Any,
    lease: Lease,
    worker_id: uuid.UUID,
    path: Path,
    info: BatchFileInfo,
    meta: BatchMetadata,
    rows: list[Any],
    put: Callable[[str, bytes], Any] | None = None,
) -> uuid.UUID:
    """What upload + complete leave behind for a batch file written for `lease`: the object at
    its lease's key (`put`, default the app's store) and the batch accepted with its rows."""
    key = batch_key(lease.run_id, lease.id, lease.fencing)
    (put or app.state.store.put_bytes)(key, path.read_bytes())
    batch = RolloutBatch(
        run_id=lease.run_id,
        lease_id=lease.id,
        worker_id=worker_id,
        adapter_version=meta.adapter_version,
        bucket_key=key,
        sha256=info.sha256,
        bytes=info.bytes,
        n_samples=info.n_samples,
        n_tokens=info.n_tokens,
        n_groups=info.n_groups,
        tokenizer_fingerprint=meta.tokenizer_fingerprint,
        state="accepted",
    )
    return record_accepted(session, lease.run_id, lease.id, batch, rows)


def accepted_batch(
    app: Any, run_id: uuid.UUID, worker_id: uuid.UUID, version: int, n_prompts: int = 2
) -> uuid.UUID:
    """What acquire + complete leave behind: the front `n_prompts` queued rows leased and then
    accepted into one completed lease's batch, whose object (a stand-in) is in the store."""
    store = app.state.store
    with transaction(app.state.sessionmaker) as session:
        rows = queued_rows(session, run_id, n_prompts)
        assert rows, "no queued rows left"
        run = session.get(Run, run_id)
        assert run is not None
        group_size = int(run.config["group_size"])
        lease = completed_lease(session, run, worker_id, version, rows, group_size)
        key = f"runs/{run_id}/batches/{lease.id}-{lease.fencing}.parquet"
        data = json.dumps({"lease": str(lease.id), "rows": [r.id for r in rows]}).encode()
        store.put_bytes(key, data)
        batch = RolloutBatch(
            run_id=run_id,
            lease_id=lease.id,
            worker_id=worker_id,
            adapter_version=version,
            bucket_key=key,
            sha256=hashlib.sha256(data).hexdigest(),
            bytes=len(data),
            n_samples=len(rows) * group_size,
            n_tokens=10 * len(rows) * group_size,
            n_groups=len(rows),
            tokenizer_fingerprint=FP,
            state="accepted",
        )
        return record_accepted(session, run_id, lease.id, batch, rows)


def completion_samples(
    session: Any, rows: list[PromptRow], config: RunConfig, tok: Any, score: Scorer | None = None
) -> list[Any]:
    """Per prompt one correct and one wrong completion, tokenized as a worker would; behaviour
    log-probs from `score(prompt ids, completion ids)` (default: -1 each)."""
    from lm.chat import encode_prompt

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    samples = []
    for row in rows:
        data = session.get(DatasetRow, row.dataset_row_id)
        ids = encode_prompt(tok, data.prompt, config.grpo.system_prompt)
        for g, text in enumerate([str(data.reference["answer"]), "no"]):
            comp = tok.encode(text, add_special_tokens=False) + [eos]
            logprobs = score(ids, comp) if score is not None else [-1.0] * len(comp)
            samples.append(RolloutSample(row.id, g, ids, comp, logprobs, "stop"))
    return samples


def real_batch(
    app: Any,
    run_id: uuid.UUID,
    worker_id: uuid.UUID,
    version: int,
    tok: Any,
    tmp: Path,
    put: Callable[[str, bytes], Any] | None = None,
    score: Scorer | None = None,
) -> uuid.UUID:
    """What acquire + upload + complete leave behind, with a real Parquet file: the next
    prompts_per_lease queued rows leased and accepted into one completed lease's batch
    (committed at once, so the learner never sees it half-written). `put` stores the object
    (default: the app's store); `score` gives the behaviour log-probs (completion_samples)."""
    from lm.chat import tokenizer_fingerprint

    with transaction(app.state.sessionmaker) as session:
        run = session.get(Run, run_id)
        assert run is not None
        config = RunConfig.model_validate(run.config)
        rows = queued_rows(session, run_id, config.prompts_per_lease)
        lease = completed_lease(session, run, worker_id, version, rows, config.group_size)
        adapter_sha = session.execute(
            select(AdapterVersion.sha256).where(
                AdapterVersion.run_id == run_id, AdapterVersion.version == version
            )
        ).scalar_one_or_none()
        meta = BatchMetadata(
            run_id=str(run_id),
            lease_id=str(lease.id),
            fencing=lease.fencing,
            worker_id=str(worker_id),
            adapter_version=version,
            adapter_sha256=adapter_sha,
            tokenizer_fingerprint=tokenizer_fingerprint(tok),
            sampling=config.sampling.model_dump(),
        )
        path = tmp / f"{lease.id}.parquet"
        info = write_batch(path, meta, completion_samples(session, rows, config, tok, score))
        return accept_batch_file(app, session, lease, worker_id, path, info, meta, rows, put)
