"""A `verifiers` environment end to end, worker to learner: the stand-in verifiers module
(tests/worker/environments/vf_standin.py, the classic MultiTurnEnv interface) rolled out by the
worker's VerifiersEnvironment (a scripted policy on the real SmolLM2 tokenizer) on a run that
requires trusted workers, so the worker scores each rollout with the environment's rubric;
written by the real batch writer, read by the learner's `Intake.load`: the batch passes the
environment check, the built-in reward `worker_score` gives the rubric's scores, and the step's
trajectory figures count them as worker-computed (`worker_scored`)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from learner.intake import Intake
from learner.trajectory_metrics import trajectory_metrics
from lm.chat import chat_messages, tokenizer_fingerprint
from protocol.batches import BatchMetadata, TrajectorySample, write_trajectory_batch
from protocol.environments import EnvironmentAllowlist
from protocol.layout import batch_key
from protocol.run_config import RunConfig
from protocol.schemas_learner import ClaimedBatch, PromptRowOut
from tests.worker.environments.scripted import ScriptedEngine
from worker.environments.registry import make_environment

pytestmark = pytest.mark.timeout(120)

RUN, LEASE, WORKER = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
MODULE = "tests.worker.environments.vf_standin"
PROMPTS = {21: "Say one word.", 22: "Name a fruit."}
REPLIES = {0: ["apple", "apple"], 1: ["apple", "pear"]}  # the rubric: 1.0 when repeated
CONFIG = {
    "name": "verifiers-e2e",
    "base_model": "smollm2-135m-instruct",
    "dataset": {"kind": "jsonl", "rows": [{"prompt": "p", "answer": "1"}]},
    "rewards": [{"name": "worker_score", "weight": 1.0}],
    "environment": {
        "name": f"verifiers:{MODULE}",
        "requires_trusted_worker": True,
        "max_turns": 2,
        "max_total_tokens": 1024,
    },
    "sampling": {"max_new_tokens": 16},
    "group_size": 2,
    "prompts_per_lease": 2,
    "prompts_per_step": 2,
}


def _batch(tmp_path: Path, tokenizer: Any, config: RunConfig) -> ClaimedBatch:
    env = make_environment(
        config.environment,
        tokenizer,
        max_model_len=2048,
        allowed=EnvironmentAllowlist(frozenset({MODULE})),
    )
    samples = []
    for row, prompt in PROMPTS.items():
        for g, replies in REPLIES.items():
            engine = ScriptedEngine(tokenizer, list(replies))
            messages = chat_messages(prompt, config.grpo.system_prompt)
            samples.append(
                TrajectorySample(row, g, env.rollout(engine, messages, max_new_tokens=16))
            )
    meta = BatchMetadata(
        format_version=2,
        run_id=str(RUN),
        lease_id=str(LEASE),
        fencing=1,
        worker_id=str(WORKER),
        adapter_version=0,
        adapter_sha256=None,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        sampling={"temperature": 1.0},
        environment=config.environment.model_dump(mode="json"),
    )
    info = write_trajectory_batch(tmp_path / "upload.parquet", meta, samples)
    return ClaimedBatch(
        batch_id=uuid.uuid4(),
        lease_id=LEASE,
        worker_id=WORKER,
        adapter_version=0,
        staleness=0,
        target_version=1,
        bucket_key=batch_key(RUN, LEASE, 1),
        sha256=info.sha256,
        size=info.bytes,
        url="file://upload",
        n_samples=len(samples),
        n_groups=len(PROMPTS),
        prompts=[
            PromptRowOut(
                prompt_row_id=row, dataset_row_id=row, prompt=p, reference={"answer": "1"}, epoch=0
            )
            for row, p in PROMPTS.items()
        ],
    )


@pytest.fixture
def intake(tmp_path: Path, small_tokenizer: Any) -> Iterator[Intake]:
    source = tmp_path / "upload.parquet"

    def download(_url: str, dest: Path, _sha: str | None) -> int:
        shutil.copyfile(source, dest)
        return dest.stat().st_size

    with Intake(
        run_id=str(RUN),
        config=RunConfig.model_validate(CONFIG),
        tokenizer=small_tokenizer,
        fingerprint=tokenizer_fingerprint(small_tokenizer),
        work_dir=tmp_path / "work",
        download=download,
    ) as it:
        yield it


def test_a_verifiers_batch_is_scored_by_the_workers_rubric(
    tmp_path: Path, small_tokenizer: Any, intake: Intake
) -> None:
    batch = _batch(tmp_path, small_tokenizer, RunConfig.model_validate(CONFIG))
    result = intake.load(batch)
    rows = result.data.rows
    assert [(r.prompt_row_id, r.group_index) for r in rows] == [(21, 0), (21, 1), (22, 0), (22, 1)]
    assert all(r.model_turns == 2 and 0 in r.loss_mask for r in rows)
    assert result.rewards_by_name["worker_score"] == [1.0, 0.0, 1.0, 0.0]
    assert trajectory_metrics(rows)["worker_scored"] == 4
    assert intake.model_text(rows[1]) == "apple\npear"
