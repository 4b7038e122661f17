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
from tests.harness.runs import jsonl, run_config
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
        # turn seeds (protocol/seeds.py) whose rollouts reach a second model turn with this model
        # (most end after one turn); keep the first two
        for seed in (34, 71, 131):
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
        run_config(
            name="trajectory-logprobs",
            dataset=jsonl([{"prompt": "p", "answer": 1}]),
            lora={"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
            prompts_per_lease=1,
            prompts_per_step=1,
        )
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


# -- a tool call on the real model ----------------------------------------------------------

TOOL_T = 0.3
TOOLS = EnvironmentConfig(name="tool_calls", tools=["calculator"], max_turns=2)
CALL = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1234 * 5678"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def tool_call_rollout() -> Iterator[tuple[Any, Trajectory]]:
    """A tool_calls rollout on the real small model (transformers backend, fallback syntax)
    whose first turn is a tool call, answered by an environment turn (the tool's result or
    error). SmolLM2-135M copies the call syntax of the fallback instructions when asked to
    repeat one (it writes their placeholder name, so the answer is a tool_error): a real
    model-written call, parsed and answered by the environment, whatever its content."""
    from worker.backends.transformers import TransformersBackend
    from worker.environments.sandbox import ToolSandbox
    from worker.environments.tool_calls import ToolCallsEnvironment

    backend = TransformersBackend(SMALL_MODEL, num_threads=1, max_loaded_adapters=1)
    try:
        with ToolSandbox() as sandbox:
            env = ToolCallsEnvironment(
                TOOLS, backend.tokenizer, max_model_len=1024, sandbox=sandbox
            )
            prompt = [{"role": "user", "content": f"Repeat after me: {CALL}"}]
            found = None
            for seed in range(8):
                engine = BackendTurnEngine(backend, temperature=TOOL_T, seed=seed)
                t = env.rollout(engine, prompt, max_new_tokens=48)
                validate_trajectory(t, 1024)
                if t.tool_calls >= 1 and "environment" in [s.kind for s in t.spans]:
                    found = t
                    break
            assert found is not None, "the small model wrote no tool call in 8 seeds"
            yield backend.tokenizer, found
    finally:
        backend.close()


def test_a_real_tool_call_trajectory_trains_model_tokens_only(tool_call_rollout: Any) -> None:
    """Masks follow the spans, the learner's environment check passes, the learner's
    log-probs of the model tokens equal the worker's, and the loss's gradient is zero on every
    environment token and non-zero on model tokens (the loss through the LoRA model)."""
    from learner.env_check import check_trajectory
    from learner.loss import grpo_loss
    from lm.models import load_model

    tokenizer, t = tool_call_rollout
    model_messages = [m for m in t.messages if m.kind == "model"]
    assert "<tool_call>" in model_messages[0].content
    assert [m.kind for m in t.messages].count("tool_result") + [m.kind for m in t.messages].count(
        "tool_error"
    ) >= 1
    for span in t.spans:
        assert set(t.loss_mask[span.start : span.end]) == {int(span.kind == "model")}
    check_trajectory(t, tokenizer, TOOLS)  # the transcript re-derives the tokens

    model = add_lora(load_model(SMALL_MODEL), _config())
    mb = collate(
        [TrainSequence(Completion.from_trajectory(t), 1.0)], pad_id=int(tokenizer.eos_token_id)
    )
    logp = packed_logprobs(model, mb.packed, TOOL_T)  # (1, T), with grad
    logp.retain_grad()
    mask = mb.completion_mask
    trained = logp[0][mask[0].bool()].tolist()
    diffs = [
        abs(a - b)
        for a, b in zip(trained, [lp for lp in t.logprobs if lp is not None], strict=True)
    ]
    assert len(diffs) == t.trained_tokens
    assert sum(diffs) / len(diffs) < MEAN_TOL and max(diffs) < MAX_TOL, max(diffs)

    loss, _ = grpo_loss(
        logp,
        mb.behaviour_logprobs,
        torch.tensor([1.0]),
        mask,
        epsilon_low=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        normaliser=float(mask.sum()),
    )
    loss.backward()
    assert logp.grad is not None
    environment = (mb.packed.completion_mask[0].bool()) & (mb.loss_mask[0] == 0)
    assert int(environment.sum()) == len(t.token_ids) - t.prompt_tokens - t.trained_tokens > 0
    assert logp.grad[0][environment].abs().max().item() == 0.0
    assert logp.grad[0][mask[0].bool()].abs().min().item() > 0.0
    lora_grads = [
        p.grad for n, p in model.named_parameters() if "lora_" in n and p.grad is not None
    ]
    assert lora_grads and any(g.abs().sum().item() > 0 for g in lora_grads)
