"""Length-bucketed micro-batches on the real small model with a LoRA adapter: the step's loss,
gradients and metrics do not depend on how its sequences were grouped; the step reports its
padding, compute time and peak memory; gradient checkpointing really recomputes the decoder
layers and changes no gradient."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from learner.data import (
    Completion,
    Group,
    micro_batches,
    padding_fraction,
    plan_step,
    step_micro_batches,
)
from learner.trainer import Trainer
from protocol.run_config import RunConfig
from tests.harness.runs import run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUDGET = 40  # padded positions per micro-batch: a few rows each


def _config(*, checkpointing: bool = False) -> RunConfig:
    return RunConfig.model_validate(
        run_config(
            name="bucketing",
            dataset={"kind": "generator"},
            group_size=3,
            sampling={"max_new_tokens": 12},
            grpo={
                "micro_batch_tokens": BUDGET,
                "max_grad_norm": 1e9,  # no clipping: the raw accumulated gradient is compared
                "gradient_checkpointing": checkpointing,
            },
        )
    )


def _groups() -> list[Group]:
    gen = torch.Generator().manual_seed(3)
    groups = []
    for prompt_len, lengths in ((3, (2, 9, 4)), (6, (11, 1, 5))):
        prompt = torch.randint(10, 4000, (prompt_len,), generator=gen).tolist()
        completions = []
        for n in lengths:
            ids = torch.randint(10, 4000, (n,), generator=gen).tolist()
            behaviour = (-torch.rand(n, generator=gen) * 2 - 6).tolist()
            completions.append(Completion(prompt, ids, behaviour))
        groups.append(Group(completions, [1.0, 0.0, 0.5]))
    return groups


def _lora(small_model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)  # fmt: skip
    return get_peft_model(copy.deepcopy(small_model).double(), config)


def _step(model: Any, config: RunConfig, **kw: Any) -> tuple[dict[str, float], list[torch.Tensor]]:
    trainer = Trainer(model, config, pad_id=0, **kw)
    metrics = trainer.train_step(_groups())
    return metrics, [p.grad.clone() for p in trainer.params]


@pytest.fixture(scope="module")
def lora64(small_model: Any) -> Any:
    return _lora(small_model)


@pytest.fixture(scope="module")
def bucketed_step(lora64: Any) -> tuple[dict[str, float], list[torch.Tensor], int]:
    """The step on the default config (bucketed by length), which three tests read: its
    metrics, gradients, and how often the first decoder layer's attention ran in it."""
    model = copy.deepcopy(lora64)
    calls = _count_attention_calls(model)
    metrics, grads = _step(model, _config())
    return metrics, grads, calls[0]


def _plan() -> Any:
    return plan_step(_groups(), loss_type="dapo", scale_rewards="group",
                     max_completion_tokens=12, skip_zero_advantage=True)  # fmt: skip


def test_gradients_do_not_depend_on_the_grouping(lora64: Any, bucketed_step: Any) -> None:
    # float64: a different grouping changes only the order of sums and the padding (which the
    # attention mask hides): rounding, measured at ~1e-15 relative on the metrics (the log-softmax
    # runs in the model's float64; it once ran in float32, ~1e-7, machine-dependent); a wrong
    # normaliser, a lost or a doubled row moves them >= 1e-2.
    sizes = [(len(s.completion.prompt_ids), len(s.completion.completion_ids))
             for s in _plan().sequences]  # fmt: skip
    bucketed, in_order = micro_batches(sizes, BUDGET), micro_batches(sizes, BUDGET, by_length=False)
    assert bucketed != in_order and len(bucketed) < len(sizes)  # a real regrouping
    runs = {
        "bucketed": bucketed_step[:2],
        "in order": _step(copy.deepcopy(lora64), _config(), bucket_by_length=False),
        "one row each": _step(copy.deepcopy(lora64), _config().model_copy(
            update={"grpo": _config().grpo.model_copy(update={"micro_batch_tokens": 1})})),
    }  # fmt: skip
    ref_metrics, ref_grads = runs["one row each"]
    assert ref_metrics["micro_batches"] == len(sizes) and ref_metrics["padding_fraction"] == 0
    assert any(g.abs().max() > 1e-4 for g in ref_grads)
    for name in ("bucketed", "in order"):
        metrics, grads = runs[name]
        assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-7), name
        for key in ("ratio_mean", "ratio_min", "ratio_max", "kl_behaviour", "entropy"):
            assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-7), (name, key)
        for got, want in zip(grads, ref_grads, strict=True):
            assert torch.allclose(got, want, rtol=1e-7, atol=1e-10), name
    assert runs["bucketed"][0]["padding_fraction"] < runs["in order"][0]["padding_fraction"]


def test_the_step_reports_padding_compute_time_and_peak_memory(bucketed_step: Any) -> None:
    metrics, _, _ = bucketed_step
    want = padding_fraction(step_micro_batches(_plan(), BUDGET, pad_id=0))
    assert metrics["padding_fraction"] == pytest.approx(want)
    assert 0 < metrics["compute_s"] <= metrics["step_seconds"]
    assert metrics["peak_memory_bytes"] > 500e6  # the process holds two float64 copies of 135M


def _count_attention_calls(model: Any) -> list[int]:
    """Counts the first decoder layer's attention forward calls (module hooks run inside a
    checkpointed layer's recomputation, so a recomputed layer counts twice)."""
    calls = [0]
    layer = model.get_base_model().model.layers[0]

    def hook(*_: Any) -> None:
        calls[0] += 1

    layer.self_attn.register_forward_hook(hook)
    return calls


def test_gradient_checkpointing_recomputes_layers_and_keeps_gradients(
    lora64: Any, bucketed_step: Any
) -> None:
    plain, plain_grads, plain_calls = bucketed_step
    ckpt_model = copy.deepcopy(lora64)
    ckpt_calls = _count_attention_calls(ckpt_model)
    ckpt, ckpt_grads = _step(ckpt_model, _config(checkpointing=True))
    assert ckpt_calls[0] == 2 * plain_calls > 0  # each micro-batch's layer ran again
    assert not ckpt_model.get_base_model().model.layers[0].self_attn.training  # dropout off
    assert ckpt["loss"] == pytest.approx(plain["loss"], rel=1e-7)
    for got, want in zip(ckpt_grads, plain_grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-7, atol=1e-10)


def test_tokens_per_s_counts_only_the_trained_sequences(lora64: Any) -> None:
    # the first group's rewards are all equal: skipped, nothing of it runs
    first, second = _groups()
    skipped = Group(first.completions, [0.5, 0.5, 0.5])
    trainer = Trainer(copy.deepcopy(lora64), _config(), pad_id=0)
    metrics = trainer.train_step([skipped, second])
    trained = sum(len(c.completion_ids) for c in second.completions)
    assert metrics["completion_tokens"] > metrics["trained_tokens"] == trained
    assert metrics["tokens_per_s"] * metrics["step_seconds"] == pytest.approx(trained)
    # every group skipped: no sequence ran, so no throughput figure at all (not 0, no spike)
    nothing = trainer.train_step([skipped, Group(second.completions, [1.0, 1.0, 1.0])])
    assert nothing["trained_tokens"] == 0 and nothing["completion_tokens"] > 0
    assert "tokens_per_s" not in nothing
