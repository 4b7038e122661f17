"""The model side of the learner: a PEFT LoRA model, AdamW, and one GRPO optimizer step over
micro-batches (gradient accumulation, all normalised by the step's total)."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from learner.data import (
    Group,
    MicroBatch,
    Share,
    StepPlan,
    collate,
    empty_micro_batch,
    micro_batches,
    padded_share,
    plan_step,
    positions,
    split_shares,
    step_micro_batches,
)
from learner.loss import grpo_loss, merge_metrics
from learner.lr_schedule import make_scheduler
from lm.adapter_io import DEFAULT_ADAPTER, adapter_parameters, canonical_name
from lm.logprobs import CHUNK_POSITIONS, packed_logprobs
from protocol.run_config import RunConfig

if TYPE_CHECKING:
    from learner.distributed import DataParallel


def model_token_bounds(config: RunConfig) -> tuple[int, int | None]:
    """The most model tokens one trajectory can hold before its prompt is counted (max_turns ×
    sampling.max_new_tokens) and the environment's max_total_tokens (None: unbounded), for
    dr_grpo's normaliser. A single-turn run without a token budget: (max_new_tokens, None)."""
    environment = config.environment
    return environment.turns * config.sampling.max_new_tokens, environment.max_total_tokens


def add_lora(model: Any, config: RunConfig, adapter_name: str = DEFAULT_ADAPTER) -> Any:
    """A fresh PEFT LoRA adapter from the run's config, named `adapter_name`: a base model is
    wrapped; a PEFT model (a pool learner's shared base, learner/shared_base.py) gains one more
    adapter. The adapter's initial weights come from the run's seed, set right before it is
    added, so they are the same in a per-run learner and in a pool learner."""
    from peft import LoraConfig, PeftModel, get_peft_model

    lora = LoraConfig(
        r=config.lora.rank,
        lora_alpha=config.lora.alpha,  # type: ignore[arg-type]
        lora_dropout=config.lora.dropout,
        target_modules=list(config.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(config.seed)
    if isinstance(model, PeftModel):
        model.add_adapter(adapter_name, lora)
        return model
    return get_peft_model(model, lora, adapter_name=adapter_name)


def activate(model: Any, adapter_name: str, gradient_checkpointing: bool) -> None:
    """Make `adapter_name` the adapter that computes and trains (the others' parameters stop
    requiring gradients), with the run's gradient checkpointing on or off. A pool learner calls
    it at each run's turn; one adapter alone is activated once."""
    if adapter_name not in model.peft_config:
        raise KeyError(f"the model has no adapter {adapter_name!r}")
    model.set_adapter(adapter_name)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    elif any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        disable = getattr(model, "activation_checkpointing_disable", None)
        (disable or model.gradient_checkpointing_disable)()
        model.eval()  # the decoder layers enable_gradient_checkpointing switched to training


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


def cap_memory(device: str, fraction: float | None) -> None:
    """Let this process's torch allocator take at most `fraction` of the CUDA device's memory
    (the learner's gpu_memory_fraction; `asyncgrpo local` shares one GPU with vLLM workers);
    nothing on CPU or without a fraction."""
    if fraction is None or torch.device(device).type != "cuda":
        return
    index = torch.device(device).index
    torch.cuda.set_per_process_memory_fraction(
        float(fraction), torch.cuda.current_device() if index is None else index
    )


def reset_peak_memory(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class StepRun:
    """What one rank's part of an optimizer step did (gathered on rank 0 when data-parallel)."""

    loss: float  # the step's loss (summed over the ranks when data-parallel)
    parts: list[dict[str, float]]  # per micro-batch metrics (learner.loss.grpo_loss)
    grad_norm: float  # before the clip, over the summed gradient
    compute_s: float
    allreduce_s: float  # 0 in one process
    micro_batches: int  # this rank's own
    empty_micro_steps: int  # run after them so every rank runs the same count
    computed_positions: int
    real_positions: int
    learning_rate: float  # the rate this step ran at (the scheduler has moved on after it)


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
        dp: DataParallel | None = None,
        adapter_name: str = DEFAULT_ADAPTER,
    ):
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.device = device
        self.bucket_by_length = bucket_by_length
        self.chunk_positions = chunk_positions
        self.dp = dp
        self.last_runs: list[StepRun] = []  # rank 0, data-parallel: every rank's last step
        self.adapter_name = adapter_name
        named = adapter_parameters(model, adapter_name)
        # the names a checkpoint keeps: those of a model whose one adapter is `default`
        self.param_names = [canonical_name(n, adapter_name) for n, _ in named]
        self.params = [p for _, p in named]
        g = config.grpo
        self.optimizer = torch.optim.AdamW(
            self.params, lr=g.learning_rate, weight_decay=g.weight_decay
        )
        self.scheduler = make_scheduler(self.optimizer, config)
        self.step = 0
        model.eval()  # dropout off: behaviour and learner log-probs stay comparable
        self.activate()

    def activate(self) -> None:
        """This trainer's adapter computes and trains, with its run's checkpointing."""
        activate(self.model, self.adapter_name, self.config.grpo.gradient_checkpointing)

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
        `peak_memory_bytes` (CUDA: this step's allocator peak; CPU: the process's peak RSS).

        Data-parallel (rank 0; the others call `train_share`): the trained sequences are split
        over the ranks (`split_shares`), each rank runs its share, the gradients are summed
        over the ranks before the clip, so the step equals one process's on the same groups.
        Extra metrics: `ranks`, `allreduce_s` (rank 0's time in the gradient all-reduce,
        waiting for slower ranks included), `comm_fraction` (allreduce_s ÷ compute_s),
        `empty_micro_steps` (over all ranks); `micro_batches` is per rank."""
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
        if self.dp is None:
            batches = step_micro_batches(
                plan, g.micro_batch_tokens, self.pad_id, by_length=self.bucket_by_length
            )
            run = self._compute(batches, plan.normaliser, len(batches))
            runs = [run]
        else:
            shares = split_shares(
                plan, self.dp.world_size, g.micro_batch_tokens, by_length=self.bucket_by_length
            )
            run = self._run_share(self.dp.scatter("step", shares))
            runs = self.dp.gather(run) or [run]
            self.last_runs = runs
        return self._step_metrics(plan, run, runs, started)

    def train_share(self, share: Share) -> StepRun:
        """A follower rank's part of a data-parallel step (rank 0 called `train_step`)."""
        reset_peak_memory(self.device)
        run = self._run_share(share)
        assert self.dp is not None
        self.dp.gather(run)
        return run

    def _run_share(self, share: Share) -> StepRun:
        budget = self.config.grpo.micro_batch_tokens
        sizes = [
            (len(s.completion.prompt_ids), len(s.completion.completion_ids))
            for s in share.sequences
        ]
        parts = micro_batches(sizes, budget, by_length=self.bucket_by_length)
        batches = [collate([share.sequences[i] for i in idx], self.pad_id) for idx in parts]
        return self._compute(batches, share.normaliser, share.micro_steps)

    def _compute(self, batches: list[MicroBatch], normaliser: float, micro_steps: int) -> StepRun:
        """Forward + backward over `batches` (then empty micro-batches up to `micro_steps`),
        the gradient all-reduce when data-parallel, the clip and the optimizer step."""
        g = self.config.grpo
        compute_started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss, parts = 0.0, []
        for mb in batches:
            part_loss, metrics = self._micro_step(mb, normaliser)
            loss += part_loss
            parts.append(metrics)
        for _ in range(micro_steps - len(batches)):
            self._micro_step(empty_micro_batch(self.pad_id), normaliser)
        allreduce_s = 0.0
        if self.dp is not None and micro_steps > 0:
            loss, allreduce_s = self._reduce_gradients(loss)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, g.max_grad_norm)
        learning_rate = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        _synchronize(self.device)
        self.step += 1
        computed, real = positions(batches)
        return StepRun(
            loss=loss,
            parts=parts,
            grad_norm=float(grad_norm),
            compute_s=time.perf_counter() - compute_started,
            allreduce_s=allreduce_s,
            micro_batches=len(batches),
            empty_micro_steps=micro_steps - len(batches),
            computed_positions=computed,
            real_positions=real,
            learning_rate=learning_rate,
        )

    def _reduce_gradients(self, loss: float) -> tuple[float, float]:
        """Sum every trainable gradient, and the loss, over the ranks (one flat all-reduce);
        returns the summed loss and the seconds the all-reduce took."""
        assert self.dp is not None
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([gr.reshape(-1) for gr in grads] + [grads[0].new_tensor([loss])])
        seconds = self.dp.all_reduce_sum(flat)
        offset = 0
        for p, gr in zip(self.params, grads, strict=True):
            n = gr.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        return float(flat[-1]), seconds

    def _step_metrics(
        self, plan: StepPlan, run: StepRun, runs: list[StepRun], started: float
    ) -> dict[str, float]:
        finished = time.perf_counter()
        merged = merge_metrics([p for r in runs for p in r.parts])
        elapsed = finished - started
        trained_tokens = merged.get("tokens", 0.0)
        computed = sum(r.computed_positions for r in runs)
        real = sum(r.real_positions for r in runs)
        out = {
            "loss": run.loss,
            "reward_mean": plan.reward_mean,
            "reward_std": plan.reward_std,
            "zero_advantage_fraction": plan.zero_advantage_groups / plan.n_groups,
            "grad_norm": run.grad_norm,
            "groups": float(plan.n_groups),
            "completion_tokens": float(plan.n_completion_tokens),
            "trained_tokens": trained_tokens,
            "step_seconds": elapsed,
            "compute_s": run.compute_s,
            "micro_batches": float(run.micro_batches + run.empty_micro_steps),
            "padding_fraction": padded_share(computed, real),
            "peak_memory_bytes": float(peak_memory_bytes(self.device)),
            "learning_rate": run.learning_rate,
        }
        if self.dp is not None:
            out["ranks"] = float(self.dp.world_size)
            out["allreduce_s"] = run.allreduce_s
            out["comm_fraction"] = run.allreduce_s / run.compute_s if run.compute_s > 0 else 0.0
            out["empty_micro_steps"] = float(sum(r.empty_micro_steps for r in runs))
        if trained_tokens > 0 and elapsed > 0:
            out["tokens_per_s"] = trained_tokens / elapsed
        out.update({k: v for k, v in merged.items() if k != "tokens"})
        return out
