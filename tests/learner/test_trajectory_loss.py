"""The loss over multi-turn trajectories (docs/architecture/environments.md, "Environments and
trajectories"): only model tokens count, environment tokens are context with no gradient, and
a single-turn sample taken as the trajectory [prompt, completion] gives exactly today's numbers.
Hand-computed values: plain Python over the model tokens, listed by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from learner.data import Completion, Group, collate, plan_step, step_micro_batches
from learner.loss import grpo_loss
from learner.trainer import Trainer, add_lora, model_token_bounds
from protocol.run_config import RunConfig
from protocol.trajectories import Trajectory, TranscriptMessage, TurnSpan
from tests.harness.runs import jsonl, run_config

# Two 2-turn trajectories: prompt (4) | model (3) | environment (2) | model (2).
SPANS = [("prompt", 0, 4), ("model", 4, 7), ("environment", 7, 9), ("model", 9, 11)]
MODEL_POSITIONS = [0, 1, 2, 5, 6]  # of the 7 tokens after the prompt
ENV_POSITIONS = [3, 4]
BEHAVIOUR = [[-0.5, -1.0, -0.2, -0.7, -0.3], [-0.9, -0.4, -1.5, -0.1, -0.6]]
CURRENT = [[-0.4, -1.3, -0.2, -0.2, -0.35], [-1.2, -0.3, -1.0, -0.15, -0.6]]
REF = [[-0.6, -1.0, -0.3, -0.5, -0.3], [-1.0, -0.5, -1.2, -0.2, -0.5]]
ADV = [0.8, -0.5]
EPS_LOW, EPS_HIGH, TIS_CAP, BETA = 0.2, 0.28, 1.2, 0.1


def trajectory(token_ids: list[int], model_logprobs: list[float]) -> Trajectory:
    lps: list[float | None] = [None] * len(token_ids)
    mask = [0] * len(token_ids)
    it = iter(model_logprobs)
    for kind, start, end in SPANS:
        if kind == "model":
            for i in range(start, end):
                lps[i], mask[i] = next(it), 1
    return Trajectory(
        token_ids=token_ids,
        loss_mask=mask,
        logprobs=lps,
        spans=[TurnSpan(kind=k, start=s, end=e) for k, s, e in SPANS],  # type: ignore[arg-type]
        messages=[
            TranscriptMessage(role="user", content="q", kind="prompt"),
            TranscriptMessage(role="assistant", content="a", kind="model"),
            TranscriptMessage(role="user", content="r", kind="tool_result", name="calculator"),
            TranscriptMessage(role="assistant", content="b", kind="model"),
        ],
        stop_reason="done",
    )


TRAJECTORIES = [
    trajectory([1, 2, 3, 4, 10, 11, 12, 20, 21, 13, 0], BEHAVIOUR[0]),
    trajectory([1, 2, 3, 4, 14, 15, 16, 22, 23, 17, 0], BEHAVIOUR[1]),
]


def current_logp(env_values: float) -> torch.Tensor:
    """(2, 7) current log-probs: CURRENT on model positions, `env_values` elsewhere."""
    out = torch.full((2, 7), env_values, dtype=torch.float64)
    for row in range(2):
        for k, pos in enumerate(MODEL_POSITIONS):
            out[row, pos] = CURRENT[row][k]
    return out


def ref_logp() -> torch.Tensor:
    out = torch.full((2, 7), -3.0, dtype=torch.float64)
    for row in range(2):
        for k, pos in enumerate(MODEL_POSITIONS):
            out[row, pos] = REF[row][k]
    return out


def clip(x: float) -> float:
    return min(max(x, 1 - EPS_LOW), 1 + EPS_HIGH)


def hand_token_losses(options: dict[str, Any]) -> list[list[float]]:
    """ℓ_t per model token, per trajectory (docs/architecture/loss.md, "Loss": its table)."""
    out = []
    for i in range(2):
        logs = [CURRENT[i][k] - BEHAVIOUR[i][k] for k in range(5)]
        a = ADV[i]
        if options.get("importance_level") == "sequence":
            ratios = [math.exp(sum(logs) / 5)] * 5
        else:
            ratios = [math.exp(x) for x in logs]
        row = []
        for k, r in enumerate(ratios):
            if options["loss_type"] == "cispo":
                value = -clip(r) * a * CURRENT[i][k]
            elif options.get("correction") == "tis":
                value = -min(r, TIS_CAP) * a
            else:
                value = -min(r * a, clip(r) * a)
            if options.get("beta"):
                d = REF[i][k] - CURRENT[i][k]
                value += BETA * (math.exp(d) - d - 1)
            row.append(value)
        out.append(row)
    return out


def hand_loss(options: dict[str, Any], dr_bound: int) -> float:
    per = hand_token_losses(options)
    loss_type = options["loss_type"]
    if loss_type in ("dapo", "cispo"):
        return sum(map(sum, per)) / 10  # the step's model tokens: 5 + 5
    if loss_type == "grpo":
        return sum(sum(row) / 5 for row in per) / 2  # trajectories, each over its own tokens
    return sum(map(sum, per)) / (2 * dr_bound)  # dr_grpo


OPTIONS = {
    "dapo": {"loss_type": "dapo"},
    "dapo-beta": {"loss_type": "dapo", "beta": BETA},
    "dapo-tis": {"loss_type": "dapo", "correction": "tis"},
    "grpo": {"loss_type": "grpo"},
    "gspo": {"loss_type": "grpo", "importance_level": "sequence"},
    "gspo-dapo": {"loss_type": "dapo", "importance_level": "sequence", "beta": BETA},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "cispo": {"loss_type": "cispo"},
}


def _plan(loss_type: str, **bounds: Any) -> Any:
    groups = [Group([Completion.from_trajectory(t) for t in TRAJECTORIES], [1.0, 0.0])]
    return plan_step(
        groups,
        loss_type=loss_type,  # type: ignore[arg-type]
        scale_rewards="none",
        skip_zero_advantage=True,
        max_completion_tokens=bounds.get("max_completion_tokens", 8),
        max_total_tokens=bounds.get("max_total_tokens"),
    )


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_loss_over_model_tokens_equals_the_hand_computed_one(name: str) -> None:
    options = OPTIONS[name]
    # dr_grpo: 2 turns × 4 new tokens = 8, bounded by max_total_tokens 10 − prompt 4 = 6
    plan = _plan(options["loss_type"], max_completion_tokens=8, max_total_tokens=10)
    mb = collate(plan.sequences, pad_id=0)
    assert mb.completion_mask.tolist() == [[1, 1, 1, 0, 0, 1, 1]] * 2
    assert [s.advantage for s in plan.sequences] == [0.5, -0.5]  # scale_rewards none
    adv = torch.tensor(ADV, dtype=torch.float64)

    def loss_for(env_values: float) -> tuple[torch.Tensor, torch.Tensor]:
        logp = current_logp(env_values).requires_grad_(True)
        loss, _ = grpo_loss(
            logp,
            mb.behaviour_logprobs.double(),
            adv,
            mb.completion_mask.double(),
            epsilon_low=EPS_LOW,
            epsilon_high=EPS_HIGH,
            loss_type=options["loss_type"],
            importance_level=options.get("importance_level", "token"),
            correction=options.get("correction", "none"),
            tis_cap=TIS_CAP,
            ref_logp=ref_logp(),
            beta=options.get("beta", 0.0),
            normaliser=plan.normaliser,
        )
        loss.backward()
        assert logp.grad is not None
        return loss.detach(), logp.grad

    loss, grad = loss_for(-2.0)
    assert float(loss) == pytest.approx(
        hand_loss(options, dr_bound=6), rel=1e-6
    )  # float32 behaviour
    # environment tokens: no gradient, and their log-probs do not move the loss
    assert grad[:, ENV_POSITIONS].abs().max().item() == 0.0
    assert grad[:, MODEL_POSITIONS].abs().max().item() > 0.0
    other, _ = loss_for(-9.0)
    assert float(other) == float(loss)


def test_normalisers_count_model_tokens_only() -> None:
    assert _plan("dapo").normaliser == 10  # not 14: the 4 environment tokens are left out
    assert _plan("cispo").normaliser == 10
    assert _plan("grpo").normaliser == 2
    assert _plan("dr_grpo", max_completion_tokens=8).normaliser == 16  # no token budget
    assert _plan("dr_grpo", max_completion_tokens=8, max_total_tokens=10).normaliser == 12
    assert _plan("dapo").n_completion_tokens == 10


def test_dr_grpo_bound_comes_from_the_environment() -> None:
    config = _config({"loss_type": "dr_grpo"}, max_new_tokens=4)
    assert model_token_bounds(config) == (4, None)  # single-turn: max_new_tokens
    tools = {"name": "tool_calls", "tools": ["calculator"], "max_turns": 3, "max_total_tokens": 64}
    config = _config({"loss_type": "dr_grpo"}, max_new_tokens=4, environment=tools)
    assert model_token_bounds(config) == (12, 64)


def _config(grpo: dict[str, Any], max_new_tokens: int = 6, **extra: Any) -> RunConfig:
    return RunConfig.model_validate(
        run_config(
            extra,
            name="trajectory-loss",
            dataset=jsonl([{"prompt": "p", "answer": 1}]),
            lora={"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
            sampling={"max_new_tokens": max_new_tokens},
            grpo={"learning_rate": 1e-2, "micro_batch_tokens": 24, **grpo},
            prompts_per_lease=1,
        )
    )


def _tiny_model() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


SINGLE_TURN = [  # (prompt, completion, behaviour log-probs, reward)
    ([1, 2, 3], [5, 6, 7, 0], [-2.0, -3.1, -3.5, -3.6], 1.0),
    ([1, 2, 3], [8, 0], [-3.3, -3.9], 0.0),
    ([4, 5, 6, 7, 8], [9, 9, 10, 11, 12, 0], [-3.7, -3.0, -3.6, -3.2, -3.8, -3.4], 0.5),
    ([4, 5, 6, 7, 8], [13, 0], [-3.6, -3.1], 0.25),
]


def as_trajectory(prompt: list[int], completion: list[int], lps: list[float]) -> Trajectory:
    """A single-turn sample as the trajectory [prompt, completion], mask 0…0 1…1."""
    p, n = len(prompt), len(prompt) + len(completion)
    return Trajectory(
        token_ids=[*prompt, *completion],
        loss_mask=[0] * p + [1] * len(completion),
        logprobs=[None] * p + list(lps),
        spans=[TurnSpan(kind="prompt", start=0, end=p), TurnSpan(kind="model", start=p, end=n)],
        messages=[
            TranscriptMessage(role="user", content="p", kind="prompt"),
            TranscriptMessage(role="assistant", content="c", kind="model"),
        ],
        stop_reason="done",
    )


@pytest.mark.parametrize(
    "grpo",
    [
        {},
        {"loss_type": "grpo", "importance_level": "sequence"},
        {"loss_type": "dr_grpo", "beta": 0.05},
        {"loss_type": "cispo", "epsilon_low": 1.0},
        {"correction": "tis"},
    ],
)
def test_single_turn_as_a_trajectory_gives_exactly_todays_step(grpo: dict[str, Any]) -> None:
    def step(make: Any) -> tuple[dict[str, float], list[torch.Tensor]]:
        config = _config(grpo)
        model = add_lora(_tiny_model(), config)
        trainer = Trainer(model, config, pad_id=0)
        groups = [
            Group(
                [make(*row[:3]) for row in SINGLE_TURN[k : k + 2]],
                [r[3] for r in SINGLE_TURN[k : k + 2]],
            )
            for k in (0, 2)
        ]
        metrics = trainer.train_step(groups)
        return metrics, [p.detach().clone() for p in trainer.params]

    today, today_params = step(Completion)
    traj, traj_params = step(lambda p, c, lps: Completion.from_trajectory(as_trajectory(p, c, lps)))
    timing = {"step_seconds", "compute_s", "tokens_per_s", "peak_memory_bytes"}
    assert {k: v for k, v in traj.items() if k not in timing} == {
        k: v for k, v in today.items() if k not in timing
    }
    assert today["micro_batches"] > 1  # the bucketing ran on both
    assert all(torch.equal(a, b) for a, b in zip(today_params, traj_params, strict=True))


def test_trajectories_pack_whole_into_micro_batches() -> None:
    plan = _plan("dapo")
    batches = step_micro_batches(plan, token_budget=11, pad_id=0)
    assert len(batches) == 2  # each trajectory (4 + 7 positions) fits alone, not together
    for mb in batches:
        assert mb.packed.input_ids.shape == (1, 11)
        assert mb.completion_mask.sum().item() == 5
