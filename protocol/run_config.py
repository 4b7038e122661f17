"""The run configuration: everything a run needs, validated at creation with precise messages.

Shared by server (validation, admission units), worker (sampling) and learner (LoRA, loss).
Field names are part of the public API (examples/runs/*.json, CI pipelines).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RewardSpec(_Strict):
    """One reward function and its weight in the total reward."""

    name: str = Field(description="A built-in reward name, or 'module:function' for user code.")
    weight: float = Field(1.0, description="Weight of this reward in the sum.")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments passed to the function."
    )


class GeneratorDataset(_Strict):
    """Prompts made by a built-in generator with a seed."""

    kind: Literal["generator"] = "generator"
    generator: str = Field("arithmetic", description="Built-in generator name, e.g. arithmetic.")
    size: int = Field(64, description="Number of prompts in one epoch.")
    seed: int = Field(0, description="Seed; the same seed gives the same prompts.")


class InlineDataset(_Strict):
    """Rows given at creation (JSONL): a `prompt` column plus reference columns."""

    kind: Literal["jsonl"] = "jsonl"
    rows: list[dict[str, Any]] = Field(
        description="Dataset rows; each has `prompt` (a string or chat messages) and "
        "reference columns that only the learner's rewards see."
    )


class LoraConfig(_Strict):
    rank: int = Field(16, description="LoRA rank r.")
    alpha: float = Field(32.0, description="LoRA alpha (scale = alpha / rank).")
    dropout: float = Field(0.0, description="LoRA dropout; 0 keeps behaviour and learner log-probs aligned.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names the adapter wraps.",
    )


class SamplingConfig(_Strict):
    """Sampling is by temperature only, so behaviour log-probs describe what was sampled."""

    temperature: float = Field(1.0, description="Sampling temperature T (> 0).")
    max_new_tokens: int = Field(32, description="Completion length limit in tokens.")
    top_p: float = Field(1.0, description="Must be 1.0 (temperature-only sampling).")
    top_k: int = Field(0, description="Must be 0 or -1 (no top-k).")
    repetition_penalty: float = Field(1.0, description="Must be 1.0 (no penalties).")
    presence_penalty: float = Field(0.0, description="Must be 0.0 (no penalties).")
    frequency_penalty: float = Field(0.0, description="Must be 0.0 (no penalties).")


class GrpoConfig(_Strict):
    learning_rate: float = Field(5e-4, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, description="Gradient-norm clip.")
    epsilon_low: float = Field(0.2, description="Lower clip ε_low of the ratio.")
    epsilon_high: float = Field(0.28, description="Upper clip ε_high of the ratio.")
    loss_type: Literal["dapo", "grpo", "dr_grpo"] = Field("dapo", description="Aggregation.")
    scale_rewards: Literal["group", "none"] = Field("group", description="Advantage scaling.")
    beta: float = Field(0.0, description="KL coefficient to the base model (k3 estimator).")
    correction: Literal["none", "tis"] = Field("none", description="Off-policy correction.")
    tis_cap: float = Field(2.0, description="Truncation cap C of TIS.")
    micro_batch_tokens: int = Field(4096, description="Token budget of one micro-batch.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for memory.")
    spot_check_fraction: float = Field(0.05, description="Share of batches re-scored by the learner.")
    system_prompt: str | None = Field(
        "You are a helpful assistant.", description="System message for string prompts."
    )


class AlarmConfig(_Strict):
    stale_waste: float = Field(0.2, description="Stale-waste fraction that raises the drift alarm.")
    clip_fraction: float = Field(0.2, description="Clip fraction (low+high) that raises an alarm.")
    no_version_minutes: float = Field(30.0, description="Alarm when no version for this long.")
    spot_check_mismatch: float = Field(
        0.05, description="Mean |Δ log-prob| above which a worker is quarantined."
    )
    window_minutes: float = Field(10.0, description="Sliding window for stale waste.")
    webhook_url: str | None = Field(None, description="POSTed a signed JSON event on alarms.")


class RunConfig(_Strict):
    """A complete run: model, data, rewards, LoRA, GRPO, sampling, units of work, limits."""

    name: str = Field(description="Human-readable run name.")
    base_model: str = Field(description="HF id, local folder, or alias smollm2-135m-instruct.")
    dataset: GeneratorDataset | InlineDataset = Field(
        discriminator="kind", description="Where the prompts come from."
    )
    rewards: list[RewardSpec] = Field(description="Reward functions with weights.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter.")
    grpo: GrpoConfig = Field(default_factory=GrpoConfig, description="GRPO and loss options.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling.")
    group_size: int = Field(8, description="G: completions per prompt (≥ 2).")
    prompts_per_lease: int = Field(2, description="Prompts in one worker lease.")
    prompts_per_step: int = Field(8, description="Groups per optimizer step (multiple of prompts_per_lease).")
    weight_sync_steps: int = Field(1, description="Optimizer steps between published versions.")
    max_staleness: int = Field(1, description="Versions a batch may lag when claimed (0 = sync).")
    max_attempts: int = Field(3, description="Re-queues before a prompt row is dropped.")
    epochs: int = Field(1, description="Passes over the dataset.")
    max_versions: int | None = Field(None, description="Stop after this many versions.")
    lease_ttl_s: float = Field(120.0, description="A lease expires this long after its last heartbeat.")
    heartbeat_interval_s: float = Field(10.0, description="How often workers heartbeat.")
    budget_usd: float | None = Field(None, description="Spend that pauses the run (None: none).")
    learner_price_per_hour: float = Field(0.0, description="USD/hour charged for the learner.")
    priority: int = Field(0, description="Higher runs are leased first.")
    seed: int = Field(0, description="Seed for lease seeds and the learner.")
    alarms: AlarmConfig = Field(default_factory=AlarmConfig, description="Alarm thresholds.")

    def admission_bound_groups(self) -> int:
        """Groups that may be leased, accepted or claimed (not yet consumed) at once."""
        return (self.max_staleness + 1) * self.weight_sync_steps * self.prompts_per_step
