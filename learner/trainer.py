"""The model side of the learner: a PEFT LoRA model, AdamW, and one GRPO optimizer step over
micro-batches (gradient accumulation, all normalised by the step's total)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from learner.data import Group, MicroBatch, plan_step, step_micro_batches
from learner.loss import grpo_loss, merge_metrics
from lm.logprobs import packed_logprobs
from protocol.run_config import RunConfig


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


class Trainer:
    """A LoRA model and its optimizer; `train_step(groups)` takes one GRPO optimizer step."""

    def __init__(self, model: Any, config: RunConfig, *, pad_id: int, device: str = "cpu"):
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.device = device
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        g = config.grpo
        self.optimizer = torch.optim.AdamW(
            self.params, lr=g.learning_rate, weight_decay=g.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _s: 1.0)
        self.step = 0
        if g.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()
        model.eval()  # dropout off: behaviour and learner log-probs stay comparable

    def _micro_step(self, mb: MicroBatch, normaliser: float) -> tuple[float, dict[str, float]]:
        g, temperature = self.config.grpo, self.config.sampling.temperature
        mb = mb.to(self.device)
        logp, entropy = packed_logprobs(self.model, mb.packed, temperature, with_entropy=True)
        ref = None
        if g.beta != 0.0:
            with torch.no_grad(), self.model.disable_adapter():
                ref = packed_logprobs(self.model, mb.packed, temperature)
        loss, metrics = grpo_loss(
            logp,
            mb.behaviour_logprobs,
            mb.advantages,
            mb.completion_mask,
            epsilon_low=g.epsilon_low,
            epsilon_high=g.epsilon_high,
            loss_type=g.loss_type,
            correction=g.correction,
            tis_cap=g.tis_cap,
            ref_logp=ref,
            beta=g.beta,
            max_completion_tokens=self.config.sampling.max_new_tokens,
            normaliser=normaliser,
        )
        loss.backward()
        if metrics["tokens"] > 0:  # mean over this micro-batch's completion tokens (pads are 0)
            metrics["entropy"] = float(entropy.sum()) / metrics["tokens"]
        return float(loss.detach()), metrics

    def train_step(self, groups: Sequence[Group]) -> dict[str, float]:
        """One optimizer step on `groups`; returns the step's metrics."""
        started = time.perf_counter()
        g = self.config.grpo
        plan = plan_step(
            groups,
            loss_type=g.loss_type,
            scale_rewards=g.scale_rewards,
            max_completion_tokens=self.config.sampling.max_new_tokens,
            skip_zero_advantage=g.beta == 0.0,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss, parts = 0.0, []
        for mb in step_micro_batches(plan, g.micro_batch_tokens, self.pad_id):
            part_loss, metrics = self._micro_step(mb, plan.normaliser)
            loss += part_loss
            parts.append(metrics)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, g.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        merged = merge_metrics(parts)
        elapsed = time.perf_counter() - started
        out = {
            "loss": loss,
            "reward_mean": plan.reward_mean,
            "reward_std": plan.reward_std,
            "zero_advantage_fraction": plan.zero_advantage_groups / plan.n_groups,
            "grad_norm": float(grad_norm),
            "groups": float(plan.n_groups),
            "completion_tokens": float(plan.n_completion_tokens),
            "trained_tokens": merged.get("tokens", 0.0),
            "tokens_per_s": plan.n_completion_tokens / elapsed if elapsed > 0 else 0.0,
            "step_seconds": elapsed,
            "learning_rate": float(self.scheduler.get_last_lr()[0]),
        }
        out.update({k: v for k, v in merged.items() if k != "tokens"})
        return out
