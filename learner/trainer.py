"""The model side of the learner: a PEFT LoRA model, AdamW, and one GRPO optimizer step over
micro-batches (gradient accumulation, all normalised by the step's total)."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from learner.data import Group, MicroBatch, padding_fraction, plan_step, step_micro_batches
from learner.loss import grpo_loss, merge_metrics
from lm.logprobs import CHUNK_POSITIONS, packed_logprobs
from protocol.run_config import RunConfig


def model_token_bounds(config: RunConfig) -> tuple[int, int | None]:
    """The most model tokens one trajectory can hold before its prompt is counted (max_turns ×
    sampling.max_new_tokens) and the environment's max_total_tokens (None: unbounded), for
    dr_grpo's normaliser. A single-turn run without a token budget: (max_new_tokens, None)."""
    environment = config.environment
    return environment.turns * config.sampling.max_new_tokens, environment.max_total_tokens


def add_lora(model: Any, config: RunConfig) -> Any:
    """Wrap a base model with a fresh PEFT LoRA adapter from the run's config."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=config.lora.rank,
        lora_alpha=config.lora.alpha,  # type: ignore[arg-type]
        lora_dropout=config.lora.dropout,
        target_modules=list(config.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them,
    with the model left in eval mode (dropout off).

    transformers checkpoints a decoder layer only while that layer is in training mode, so
    `gradient_checkpointing_enable` alone does nothing on a model in eval mode: the decoder
    layers themselves (not their children: attention and LoRA dropout stay off) are switched
    to training mode. Non-reentrant checkpointing needs no input that requires a gradient."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.eval()
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module.training = True


def peak_memory_bytes(device: str) -> int:
    """The step's memory high-water mark: on CUDA the allocator's peak since
    `reset_peak_memory` (tensors only); elsewhere the process's peak resident set size
    (ru_maxrss), a high-water mark of the whole process since it started — it never goes
    down, so a step's figure is the largest of all steps so far, model and runtime included."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux counts KiB


def reset_peak_memory(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    """A LoRA model and its optimizer; `train_step(groups)` takes one GRPO optimizer step.

    `bucket_by_length` and `chunk_positions` select the micro-batching rule
    (learner.data.micro_batches) and the log-prob path (lm.logprobs.packed_logprobs); the
    defaults are the learner's, the others exist for the benchmark's baseline."""

    def __init__(
        self,
        model: Any,
        config: RunConfig,
        *,
        pad_id: int,
        device: str = "cpu",
        bucket_by_length: bool = True,
        chunk_positions: int | None = CHUNK_POSITIONS,
    ):
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.device = device
        self.bucket_by_length = bucket_by_length
        self.chunk_positions = chunk_positions
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        g = config.grpo
        self.optimizer = torch.optim.AdamW(
            self.params, lr=g.learning_rate, weight_decay=g.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _s: 1.0)
        self.step = 0
        model.eval()  # dropout off: behaviour and learner log-probs stay comparable
        if g.gradient_checkpointing:
            enable_gradient_checkpointing(model)

    def _micro_step(self, mb: MicroBatch, normaliser: float) -> tuple[float, dict[str, float]]:
        g, temperature = self.config.grpo, self.config.sampling.temperature
        mb = mb.to(self.device)
        chunk = self.chunk_positions
        logp, entropy = packed_logprobs(
            self.model, mb.packed, temperature, with_entropy=True, chunk_positions=chunk
        )
        ref = None
        if g.beta != 0.0:
            with torch.no_grad(), self.model.disable_adapter():
                ref = packed_logprobs(self.model, mb.packed, temperature, chunk_positions=chunk)
        loss, metrics = grpo_loss(
            logp,
            mb.behaviour_logprobs,
            mb.advantages,
            mb.completion_mask,
            epsilon_low=g.epsilon_low,
            epsilon_high=g.epsilon_high,
            loss_type=g.loss_type,
            importance_level=g.importance_level,
            correction=g.correction,
            tis_cap=g.tis_cap,
            ref_logp=ref,
            beta=g.beta,
            max_completion_tokens=self.config.sampling.max_new_tokens,
            normaliser=normaliser,
        )
        loss.backward()
        if metrics["tokens"] > 0:  # mean over this micro-batch's trained tokens
            metrics["entropy"] = float((entropy * mb.completion_mask).sum()) / metrics["tokens"]
        return float(loss.detach()), metrics

    def train_step(self, groups: Sequence[Group]) -> dict[str, float]:
        """One optimizer step on `groups`; returns the step's metrics.

        Timing: `step_seconds` is the whole call (planning, padding into micro-batches, then the
        compute); `compute_s` only the compute — every micro-batch's transfer, forward and
        backward, the gradient clip and the optimizer step (on CUDA, synchronised at its end).
        `tokens_per_s` is the completion tokens actually trained (`trained_tokens`: groups
        skipped for equal rewards run nothing) ÷ `step_seconds`, and absent when nothing ran
        (a figure from a step that ran no sequence would measure only the planning).
        `padding_fraction`: padded ÷
        computed positions of the step's micro-batches. `peak_memory_bytes`: see
        `peak_memory_bytes` (CUDA: this step's allocator peak; CPU: the process's peak RSS)."""
        started = time.perf_counter()
        reset_peak_memory(self.device)
        g = self.config.grpo
        most, max_total = model_token_bounds(self.config)
        plan = plan_step(
            groups,
            loss_type=g.loss_type,
            scale_rewards=g.scale_rewards,
            max_completion_tokens=most,
            skip_zero_advantage=g.beta == 0.0,
            max_total_tokens=max_total,
        )
        batches = step_micro_batches(
            plan, g.micro_batch_tokens, self.pad_id, by_length=self.bucket_by_length
        )
        compute_started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss, parts = 0.0, []
        for mb in batches:
            part_loss, metrics = self._micro_step(mb, plan.normaliser)
            loss += part_loss
            parts.append(metrics)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, g.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        _synchronize(self.device)
        finished = time.perf_counter()
        self.step += 1
        merged = merge_metrics(parts)
        elapsed = finished - started
        trained_tokens = merged.get("tokens", 0.0)
        out = {
            "loss": loss,
            "reward_mean": plan.reward_mean,
            "reward_std": plan.reward_std,
            "zero_advantage_fraction": plan.zero_advantage_groups / plan.n_groups,
            "grad_norm": float(grad_norm),
            "groups": float(plan.n_groups),
            "completion_tokens": float(plan.n_completion_tokens),
            "trained_tokens": trained_tokens,
            "step_seconds": elapsed,
            "compute_s": finished - compute_started,
            "micro_batches": float(len(batches)),
            "padding_fraction": padding_fraction(batches),
            "peak_memory_bytes": float(peak_memory_bytes(self.device)),
            "learning_rate": float(self.scheduler.get_last_lr()[0]),
        }
        if trained_tokens > 0 and elapsed > 0:
            out["tokens_per_s"] = trained_tokens / elapsed
        out.update({k: v for k, v in merged.items() if k != "tokens"})
        return out
