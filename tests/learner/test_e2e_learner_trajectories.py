"""The learner process on a multi-turn (guess_number) run against the real server (uvicorn,
Postgres, local store): it claims a real format 2 batch whose trajectories the worker's
environment made (a scripted policy on the real tokenizer), checks it (env_check), scores the
model's text, trains over model tokens, publishes versions until the run is exhausted, and
posts the step's trajectory figures (turns, tool calls and errors, stop reasons) with its
metrics."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from lm.chat import chat_messages, tokenizer_fingerprint
from protocol.batches import BatchMetadata, TrajectorySample, write_trajectory_batch
from protocol.run_config import RunConfig
from server.db import transaction
from server.models import DatasetRow, RolloutBatch, Run
from server.models.telemetry import MetricPoint
from tests.harness.batches import accept_batch_file, completed_lease, queued_rows
from tests.harness.live_app import LiveApp
from tests.server.learner.support import make_run, make_worker
from tests.worker.environments.scripted import ScriptedEngine
from worker.environments.guess_number import GuessNumberEnvironment

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

ROWS = [{"prompt": f"Guess my number, then say {i + 5}.", "answer": str(i + 5)} for i in range(2)]
GAME = {"name": "guess_number", "kwargs": {"low": 1000, "high": 10**6}, "max_turns": 2}


def _trajectory_batch(
    app: Any, run_id: uuid.UUID, worker_id: uuid.UUID, tok: Any, tmp: Path
) -> uuid.UUID:
    """Every queued row leased and accepted into one completed lease's format 2 batch: per
    prompt, sample 0 guesses 1 (the game answers "Higher.") then says the answer, sample 1
    guesses 2 then says 0."""
    with transaction(app.state.sessionmaker) as session:
        run = session.get(Run, run_id)
        assert run is not None
        config = RunConfig.model_validate(run.config)
        rows = queued_rows(session, run_id, None)
        env = GuessNumberEnvironment(config.environment, tok, max_model_len=2048)
        samples = []
        for row in rows:
            data = session.get(DatasetRow, row.dataset_row_id)
            messages = chat_messages(data.prompt, config.grpo.system_prompt)
            for g, replies in enumerate([["1", str(data.reference["answer"])], ["2", "0"]]):
                t = env.rollout(
                    ScriptedEngine(tok, replies), messages, max_new_tokens=8, seed=row.id
                )
                assert [s.kind for s in t.spans] == ["prompt", "model", "environment", "model"]
                samples.append(TrajectorySample(row.id, g, t))
        lease = completed_lease(session, run, worker_id, 0, rows, config.group_size)
        fencing = lease.fencing
        meta = BatchMetadata(
            format_version=2,
            run_id=str(run_id),
            lease_id=str(lease.id),
            fencing=fencing,
            worker_id=str(worker_id),
            adapter_version=0,
            adapter_sha256=None,
            tokenizer_fingerprint=tokenizer_fingerprint(tok),
            sampling=config.sampling.model_dump(),
            environment=config.environment.model_dump(mode="json"),
        )
        path = tmp / f"{lease.id}.parquet"
        info = write_trajectory_batch(path, meta, samples)
        return accept_batch_file(app, session, lease, worker_id, path, info, meta, rows)


def test_the_learner_trains_a_multi_turn_run_and_reports_its_trajectories(
    live: LiveApp,
    tmp_path: Path,
) -> None:
    from lm.models import load_tokenizer

    app = live.app
    run = make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        environment=GAME,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={"spot_check_fraction": 0.0, "learning_rate": 1e-3},
        sampling={"max_new_tokens": 8},
    )
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    batch_id = _trajectory_batch(app, run.id, worker_id, tok, tmp_path)
    log = live.learner_log
    proc = live.learner(run)
    try:
        assert proc.wait(400) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    with transaction(app.state.sessionmaker) as session:
        run_row = session.get(Run, run.id)
        batch = session.get(RolloutBatch, batch_id)
        points = list(
            session.execute(
                select(MetricPoint).where(
                    MetricPoint.run_id == run.id, MetricPoint.source == "learner"
                )
            ).scalars()
        )
        assert run_row is not None and run_row.status == "completed", run_row
        assert batch is not None and (batch.state, batch.consumed_version) == ("consumed", 1)
        values = [p.values for p in points if "trajectories" in p.values]
    assert len(values) == 1, [p.values for p in points]
    (step,) = values
    assert step["trajectories"] == 4 and step["turns_mean"] == 2.0
    assert (step["tool_calls"], step["tool_errors"], step["worker_scored"]) == (0, 0, 0)
    # nobody guessed the secret (≥ 1000) in the 2 turns
    assert step["stop_max_turns"] == 4 and step["stop_done"] == 0
    assert step["model_tokens_mean"] == 4.0 and step["trained_tokens"] == 16  # 2 turns × (1 + EOS)
    # the rewards saw the model's text of both turns: sample 0 ends on the answer (its first
    # turn, 1, is no answer)
    assert step["reward_mean"] == pytest.approx(0.5)
