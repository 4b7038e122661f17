"""Builders of valid rollout batches and their expectations, for the batch tests."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from protocol.batches import (
    METADATA_KEY,
    BatchExpectations,
    BatchMetadata,
    RolloutSample,
    samples_table,
    write_batch,
)

RUN_ID = "6f1c2a3e-0000-4000-8000-000000000001"
LEASE_ID = "6f1c2a3e-0000-4000-8000-000000000002"
WORKER_ID = "6f1c2a3e-0000-4000-8000-000000000003"
FINGERPRINT = "ab" * 32
ADAPTER_SHA = "cd" * 32
PROMPT_ROWS = (101, 102, 103)
GROUP = 4
VOCAB = 1000
MAX_NEW = 16
SAMPLING = {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "max_new_tokens": MAX_NEW}


def make_meta(**over: Any) -> BatchMetadata:
    fields: dict[str, Any] = {
        "run_id": RUN_ID,
        "lease_id": LEASE_ID,
        "fencing": 7,
        "worker_id": WORKER_ID,
        "adapter_version": 3,
        "adapter_sha256": ADAPTER_SHA,
        "tokenizer_fingerprint": FINGERPRINT,
        "sampling": dict(SAMPLING),
    }
    fields.update(over)
    return BatchMetadata(**fields)


def prompt_of(row_id: int) -> list[int]:
    return [1, row_id % VOCAB, 5, 6, 2]


def make_samples(seed: int = 0) -> list[RolloutSample]:
    rng = random.Random(seed)
    out = []
    for row_id in PROMPT_ROWS:
        for g in range(GROUP):
            n = rng.randint(1, MAX_NEW)
            out.append(
                RolloutSample(
                    prompt_row_id=row_id,
                    group_index=g,
                    prompt_token_ids=prompt_of(row_id),
                    completion_token_ids=[rng.randrange(VOCAB) for _ in range(n)],
                    behaviour_logprobs=[-rng.random() * 5 for _ in range(n)],
                    finish_reason="length" if n == MAX_NEW else "stop",
                )
            )
    rng.shuffle(out)  # the reader must not depend on row order
    return out


def make_expect(**over: Any) -> BatchExpectations:
    expect = BatchExpectations(
        run_id=RUN_ID,
        lease_id=LEASE_ID,
        fencing=7,
        worker_id=WORKER_ID,
        adapter_version=3,
        adapter_sha256=ADAPTER_SHA,
        tokenizer_fingerprint=FINGERPRINT,
        prompt_row_ids=PROMPT_ROWS,
        group_size=GROUP,
        vocab_size=VOCAB,
        max_new_tokens=MAX_NEW,
        sampling=dict(SAMPLING),
        prompt_token_ids={r: prompt_of(r) for r in PROMPT_ROWS},
    )
    return replace(expect, **over)


def write_valid(path: Path, seed: int = 0) -> Path:
    write_batch(path, make_meta(), make_samples(seed))
    return path


def write_table(path: Path, table: pa.Table, meta: BatchMetadata | None = None) -> Path:
    """Write any table (possibly malformed) with batch metadata in the footer."""
    raw = json.dumps((meta or make_meta()).model_dump(mode="json")).encode()
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: raw}), path)
    return path


def valid_table(seed: int = 0) -> pa.Table:
    return samples_table(make_meta(), make_samples(seed))


def with_column(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    """Replace one column, keeping the others (the new column's type is taken as given)."""
    i = table.column_names.index(name)
    return table.set_column(i, pa.field(name, array.type), array)
