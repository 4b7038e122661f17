"""On the real small model: trajectories rolled out by `guess_number` through the transformers
backend (token-in, token-out), then re-scored by the learner in one forward pass per
trajectory (environment turns as context), in a padded micro-batch of two: the log-probs of
the model tokens equal the worker's to the backend test's tolerance, through both the
trainer's path (collate + packed_logprobs, the LoRA-wrapped model) and the spot check's
(completion_logprobs with masks)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from learner.data import Completion, TrainSequence, collate
from learner.spotcheck import reported_logprobs
from learner.trainer import add_lora
from lm.logprobs import completion_logprobs, packed_logprobs
from protocol.batch_reader import TrajectoryRecord
from protocol.environments import EnvironmentConfig
from protocol.run_config import RunConfig
from protocol.trajectories import Trajectory, validate_trajectory
from tests.worker.conftest import SMALL_MODEL
from worker.environments.backend_engine import BackendTurnEngine
from worker.environments.guess_number import GuessNumberEnvironment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

T = 0.7
MEAN_TOL, MAX_TOL = 1e-4, 1e-3  # tests/worker/test_transformers_backend.py


@pytest.fixture(scope="module")
def rolled_out() -> Iterator[tuple[Any, list[Trajectory]]]:
    from worker.backends.transformers import TransformersBackend

    backend = TransformersBackend(SMALL_MODEL, num_threads=1, max_loaded_adapters=1)
    try:
        config = EnvironmentConfig(
            name="guess_number", kwargs={"low": 1, "high": 10**6}, max_turns=3
        )
        env = GuessNumberEnvironment(config, backend.tokenizer, max_model_len=1024)
        prompt = [{"role": "user", "content": "Let's play. Your first guess?"}]
        out: list[Trajectory] = []
        for seed in range(11, 19):  # deterministic; keep the first two with an environment turn
            engine = BackendTurnEngine(backend, temperature=T, seed=seed)
            t = env.rollout(engine, prompt, max_new_tokens=12, seed=5)
            validate_trajectory(t, 1024)
            if t.model_turns >= 2:
                out.append(t)
            if len(out) == 2:
                break
        yield backend.tokenizer, out
    finally:
        backend.close()


def _config() -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "trajectory-logprobs",
            "base_model": "smollm2-135m-instruct",
            "dataset": {"kind": "jsonl", "rows": [{"prompt": "p", "answer": 1}]},
            "rewards": [{"name": "numeric_match"}],
            "lora": {"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
            "group_size": 2,
            "prompts_per_lease": 1,
            "prompts_per_step": 1,
        }
    )


def _assert_close(recomputed: list[list[float]], ts: list[Trajectory]) -> None:
    diffs = [
        abs(a - b)
        for rec, t in zip(recomputed, ts, strict=True)
        for a, b in zip(rec, [lp for lp in t.logprobs if lp is not None], strict=True)
    ]
    assert len(diffs) == sum(t.trained_tokens for t in ts)
    assert sum(diffs) / len(diffs) < MEAN_TOL and max(diffs) < MAX_TOL, max(diffs)


def test_learner_logprobs_of_model_tokens_equal_the_workers(rolled_out: Any) -> None:
    from lm.models import load_model

    tokenizer, ts = rolled_out
    assert len(ts) == 2 and all("environment" in [s.kind for s in t.spans] for t in ts)
    assert len(ts[0].token_ids) != len(ts[1].token_ids)  # so the micro-batch pads one
    model = add_lora(load_model("smollm2-135m-instruct"), _config()).eval()
    pad = int(tokenizer.eos_token_id)

    mb = collate([TrainSequence(Completion.from_trajectory(t), 0.0) for t in ts], pad_id=pad)
    with torch.no_grad():
        logp = packed_logprobs(model, mb.packed, T)  # (2, T): the trainer's path
    trained = [
        row[mask.bool()].tolist() for row, mask in zip(logp, mb.completion_mask, strict=True)
    ]
    _assert_close(trained, ts)

    rows = [
        TrajectoryRecord(
            prompt_row_id=1,
            group_index=g,
            token_ids=t.token_ids,
            loss_mask=t.loss_mask,
            logprobs=t.logprobs,
            spans=t.spans,
            messages=t.messages,
            stop_reason=t.stop_reason,
        )
        for g, t in enumerate(ts)
    ]
    spot = completion_logprobs(
        model,
        [r.prompt_token_ids for r in rows],
        [r.token_ids[r.prompt_tokens :] for r in rows],
        T,
        pad_id=pad,
        masks=[r.loss_mask[r.prompt_tokens :] for r in rows],
    )
    _assert_close(spot, ts)
    assert [len(x) for x in reported_logprobs(rows)] == [t.trained_tokens for t in ts]
