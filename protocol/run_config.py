"""The run configuration: everything a run needs, validated at creation with precise messages.

Shared by server (validation, admission units), worker (sampling) and learner (LoRA, loss).
Field names are part of the public API (examples/runs/*.json, CI pipelines).

Every rule below produces an error at the field's path whose message names the field, the rule
and the value received, e.g. `group_size must be at least 2 ... (got 1)`. Unknown fields are
refused at every nesting level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlparse

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from protocol import datasets, rewards
from protocol.schemas import BIGINT_MAX, INT_MAX, KIB, MAX_MODEL_NAME, free_json

MAX_NEW_TOKENS = 8192
MAX_PROMPT_ROWS = 5_000_000  # epochs × dataset rows, all created up front
MAX_ROW_BYTES = 1024 * KIB  # one dataset row as JSON
MAX_LORA_RANK = 1024
MAX_LEARNER_PRICE_PER_HOUR = 10_000.0  # USD; far above any GPU box, far below float overflow
_SAMPLED = "behaviour log-probs must describe the distribution actually sampled"


def _fail(message: str) -> PydanticCustomError:
    return PydanticCustomError("config_rule", message)


Rule = tuple[Callable[[Any], bool], str]
# torch.manual_seed and random.seed take it: a non-negative signed 64-bit integer.
SEED_RULE: Rule = (lambda n: 0 <= n <= BIGINT_MAX, f"must be between 0 and {BIGINT_MAX:,}")

# Completions per prompt: bounded so that a group's counts stay far inside the database's
# integer columns (an unbounded G was accepted, then every lease acquire failed with a 500).
MAX_GROUP_SIZE = 1024
# Run.groups_in_flight is an INTEGER column compared with the admission bound.
MAX_ADMISSION_BOUND = INT_MAX


class _Strict(BaseModel):
    """Refuses unknown fields, NaN and infinities; applies the class's RULES to each field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_default=True)
    RULES: ClassVar[dict[str, Rule]] = {}

    @field_validator("*")
    @classmethod
    def _apply_rule(cls, value: Any, info: ValidationInfo) -> Any:
        rule = cls.RULES.get(info.field_name or "")
        if rule is not None and value is not None and not rule[0](value):
            raise _fail(f"{info.field_name} {rule[1]} (got {value!r})")
        return value


class RewardSpec(_Strict):
    """One reward function and its weight in the total reward."""

    name: str = Field(description="A built-in reward name, or 'module:function' for user code.")
    weight: float = Field(1.0, description="Weight of this reward in the sum.")
    kwargs: Annotated[dict[str, Any], AfterValidator(free_json(64 * KIB))] = Field(
        default_factory=dict,
        description="Extra keyword arguments passed to the function (JSON of at most 64 KiB, "
        "nested at most 32 levels, finite numbers only).",
    )

    @field_validator("name")
    @classmethod
    def _known_or_module_function(cls, name: str) -> str:
        try:
            rewards.check_name(name)
        except rewards.RewardError as exc:
            raise _fail(str(exc)) from None
        return name

    @field_validator("kwargs")
    @classmethod
    def _builtin_kwargs(cls, kwargs: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("name")
        if name is not None:
            try:
                rewards.check_kwargs(name, kwargs)
            except rewards.RewardError as exc:
                raise _fail(str(exc)) from None
        return kwargs


class GeneratorDataset(_Strict):
    """Prompts made by a built-in generator with a seed."""

    kind: Literal["generator"] = "generator"
    generator: str = Field("arithmetic", description="Built-in generator name, e.g. arithmetic.")
    size: int = Field(64, description="Number of prompts in one epoch.")
    seed: int = Field(0, description="Seed; the same seed gives the same prompts.")

    RULES: ClassVar[dict[str, Rule]] = {
        "generator": (
            lambda g: g in datasets.GENERATORS,
            f"must be a built-in generator ({', '.join(sorted(datasets.GENERATORS))})",
        ),
        "size": (
            lambda n: 1 <= n <= datasets.MAX_GENERATOR_SIZE,
            f"must be between 1 and {datasets.MAX_GENERATOR_SIZE:,}",
        ),
        "seed": SEED_RULE,
    }

    def n_rows(self) -> int:
        return self.size


def _check_row(row: dict[str, Any]) -> dict[str, Any]:
    try:
        return datasets.check_row(row)
    except datasets.DatasetError as exc:
        raise _fail(str(exc)) from None


class InlineDataset(_Strict):
    """Rows given at creation (JSONL): a `prompt` column plus reference columns."""

    kind: Literal["jsonl"] = "jsonl"
    rows: list[
        Annotated[
            dict[str, Any], AfterValidator(free_json(MAX_ROW_BYTES)), AfterValidator(_check_row)
        ]
    ] = Field(
        description="Dataset rows (at most 100,000); each has `prompt` (a non-empty string or "
        "chat messages {role, content} with roles system/user/assistant) and reference columns "
        "that only the learner's rewards see; a row is at most 1 MiB as JSON, nested at most "
        "32 levels, with finite numbers only."
    )

    @field_validator("rows", mode="before")
    @classmethod
    def _row_count(cls, rows: Any) -> Any:
        # Before per-row validation, so an oversized dataset fails fast with one message.
        if isinstance(rows, list) and not 1 <= len(rows) <= datasets.MAX_JSONL_ROWS:
            raise _fail(
                f"rows must hold between 1 and {datasets.MAX_JSONL_ROWS:,} rows (got {len(rows):,})"
            )
        return rows

    def n_rows(self) -> int:
        return len(self.rows)


class LoraConfig(_Strict):
    """The LoRA adapter the learner trains and workers load."""

    RULES: ClassVar[dict[str, Rule]] = {
        "rank": (
            lambda r: 1 <= r <= MAX_LORA_RANK,
            f"must be between 1 and {MAX_LORA_RANK} (LoRA ranks are small)",
        ),
        "alpha": (lambda a: a > 0, "must be greater than 0"),
        "dropout": (lambda d: 0 <= d < 1, "must be in [0, 1)"),
        "target_modules": (
            lambda m: len(m) > 0 and all(x.strip() for x in m),
            "must name at least one module, with no empty names",
        ),
    }

    rank: int = Field(16, description="LoRA rank r.")
    alpha: float = Field(32.0, description="LoRA alpha (scale = alpha / rank).")
    dropout: float = Field(
        0.0, description="LoRA dropout; 0 keeps behaviour and learner log-probs aligned."
    )
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

    RULES: ClassVar[dict[str, Rule]] = {
        "temperature": (lambda t: t > 0, "must be greater than 0"),
        "max_new_tokens": (
            lambda n: 1 <= n <= MAX_NEW_TOKENS,
            f"must be between 1 and {MAX_NEW_TOKENS}",
        ),
        "top_p": (lambda p: p == 1.0, f"must be 1.0: sampling is by temperature only ({_SAMPLED})"),
        "top_k": (lambda k: k in (0, -1), f"must be 0 or -1 (no top-k; {_SAMPLED})"),
        "repetition_penalty": (lambda p: p == 1.0, f"must be 1.0 (no penalties; {_SAMPLED})"),
        "presence_penalty": (lambda p: p == 0.0, f"must be 0.0 (no penalties; {_SAMPLED})"),
        "frequency_penalty": (lambda p: p == 0.0, f"must be 0.0 (no penalties; {_SAMPLED})"),
    }


class GrpoConfig(_Strict):
    """GRPO and loss options. `scale_rewards = "none"` is recommended with `dr_grpo`."""

    RULES: ClassVar[dict[str, Rule]] = {
        "learning_rate": (lambda x: x > 0, "must be greater than 0"),
        "weight_decay": (lambda x: x >= 0, "must be at least 0"),
        "max_grad_norm": (lambda x: x > 0, "must be greater than 0"),
        "epsilon_low": (lambda x: 0 <= x < 1, "must be in [0, 1)"),
        "epsilon_high": (lambda x: x >= 0, "must be at least 0"),
        "beta": (lambda x: x >= 0, "must be at least 0"),
        "tis_cap": (lambda x: x >= 1, "must be at least 1"),
        "micro_batch_tokens": (lambda x: x >= 1, "must be at least 1"),
        "spot_check_fraction": (lambda x: 0 <= x <= 1, "must be in [0, 1]"),
    }

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
    spot_check_fraction: float = Field(
        0.05, description="Share of batches re-scored by the learner."
    )
    system_prompt: str | None = Field(
        "You are a helpful assistant.", description="System message for string prompts."
    )


MAX_EVAL_PROMPTS = 100_000
MAX_EVAL_SAMPLES = 1024
MAX_EVAL_LEASES = 1024


class EvalConfig(_Strict):
    """Held-out evaluation during training: versions 0, k, 2k, … and the final version are
    sampled on the eval prompts and scored with the run's rewards (README, "Evaluation during
    training")."""

    dataset: GeneratorDataset | InlineDataset = Field(
        discriminator="kind", description="The held-out prompts (e.g. a test split)."
    )
    every_versions: int = Field(
        1,
        description="Evaluate versions 0, k, 2k, … (k = every_versions) and always the final "
        "version; version 0 is the base model.",
    )
    n: int = Field(1, description="Samples per eval prompt (pass@n is over these).")
    temperature: float = Field(
        0.0, description="Sampling temperature of eval (0: greedy, which needs n = 1)."
    )
    max_prompts: int | None = Field(
        None, description="Evaluate at most this many prompts of the dataset (None: all)."
    )
    max_new_tokens: int | None = Field(
        None, description="Completion length limit of eval (None: sampling.max_new_tokens)."
    )
    accuracy_reward: str = Field(
        description="Name of one of the run's rewards: a sample is accurate when its value "
        "is at least `threshold`."
    )
    threshold: float = Field(1.0, description="Accuracy threshold on accuracy_reward.")
    max_leases_in_flight: int = Field(
        2, description="Eval leases active at once (eval's own bound, beside training's)."
    )

    RULES: ClassVar[dict[str, Rule]] = {
        "every_versions": (lambda k: 1 <= k <= INT_MAX, f"must be between 1 and {INT_MAX:,}"),
        "n": (lambda n: 1 <= n <= MAX_EVAL_SAMPLES, f"must be between 1 and {MAX_EVAL_SAMPLES}"),
        "max_prompts": (
            lambda n: 1 <= n <= MAX_EVAL_PROMPTS,
            f"must be between 1 and {MAX_EVAL_PROMPTS:,} when set",
        ),
        "max_new_tokens": (
            lambda n: 1 <= n <= MAX_NEW_TOKENS,
            f"must be between 1 and {MAX_NEW_TOKENS} when set",
        ),
        "max_leases_in_flight": (
            lambda n: 1 <= n <= MAX_EVAL_LEASES,
            f"must be between 1 and {MAX_EVAL_LEASES}",
        ),
        "accuracy_reward": (lambda s: 1 <= len(s) <= 500, "must be 1 to 500 characters"),
    }

    @field_validator("max_prompts")
    @classmethod
    def _bounded_prompts(cls, n: int | None, info: ValidationInfo) -> int | None:
        dataset = info.data.get("dataset")
        n_rows = getattr(dataset, "n_rows", None)  # a stored dataset's size is known later
        if n is None and n_rows is not None and n_rows() > MAX_EVAL_PROMPTS:
            raise _fail(
                f"max_prompts must be set when the eval dataset has more than "
                f"{MAX_EVAL_PROMPTS:,} rows: every evaluated version samples each eval prompt "
                f"(got {n_rows():,} rows)"
            )
        return n

    @field_validator("temperature")
    @classmethod
    def _greedy_needs_one_sample(cls, t: float, info: ValidationInfo) -> float:
        if t < 0:
            raise _fail(f"temperature must be at least 0 (0 is greedy) (got {t!r})")
        n = info.data.get("n")
        if t == 0 and n is not None and n != 1:
            raise _fail(
                f"temperature 0 is greedy decoding: every sample would be the same, so n must be "
                f"1 (got n = {n})"
            )
        return t

    def n_prompts(self) -> int:
        rows = self.dataset.n_rows()
        return rows if self.max_prompts is None else min(rows, self.max_prompts)


def _http_url(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme in ("http", "https") and bool(parsed.netloc)


class AlarmConfig(_Strict):
    """Drift-alarm thresholds and where to send alarms."""

    RULES: ClassVar[dict[str, Rule]] = {
        "stale_waste": (lambda x: 0 < x <= 1, "must be a fraction in (0, 1]"),
        "clip_fraction": (lambda x: 0 < x <= 1, "must be a fraction in (0, 1]"),
        "no_version_minutes": (lambda x: x > 0, "must be greater than 0"),
        "spot_check_mismatch": (lambda x: x > 0, "must be greater than 0"),
        "window_minutes": (lambda x: 0 < x <= 24 * 60, "must be in (0, 1440] minutes"),
        "webhook_url": (_http_url, "must be an http:// or https:// URL with a host"),
    }

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
    prompts_per_step: int = Field(
        8, description="Groups per optimizer step (multiple of prompts_per_lease)."
    )
    weight_sync_steps: int = Field(1, description="Optimizer steps between published versions.")
    max_staleness: int = Field(1, description="Versions a batch may lag when claimed (0 = sync).")
    max_attempts: int = Field(3, description="Re-queues before a prompt row is dropped.")
    admission_control: bool = Field(
        True,
        description="Admission control: acquire answers 204 at the bound and heartbeats abort "
        "leases that can no longer be admissible. Off only for benchmarks.",
    )
    epochs: int = Field(1, description="Passes over the dataset.")
    max_versions: int | None = Field(None, description="Stop after this many versions.")
    lease_ttl_s: float = Field(
        120.0, description="A lease expires this long after its last heartbeat."
    )
    heartbeat_interval_s: float = Field(10.0, description="How often workers heartbeat.")
    budget_usd: float | None = Field(None, description="Spend that pauses the run (None: none).")
    learner_price_per_hour: float = Field(0.0, description="USD/hour charged for the learner.")
    priority: int = Field(0, description="Higher runs are leased first.")
    seed: int = Field(0, description="Seed for lease seeds and the learner.")
    alarms: AlarmConfig = Field(default_factory=AlarmConfig, description="Alarm thresholds.")
    eval: EvalConfig | None = Field(
        None, description="Held-out evaluation during training (None: no evaluation)."
    )

    RULES: ClassVar[dict[str, Rule]] = {
        "name": (lambda s: 1 <= len(s.strip()) and len(s) <= 200, "must be 1 to 200 characters"),
        "base_model": (
            lambda s: 1 <= len(s.strip()) and len(s) <= MAX_MODEL_NAME,
            f"must be 1 to {MAX_MODEL_NAME} characters",
        ),
        "rewards": (lambda r: len(r) >= 1, "must list at least one reward"),
        "group_size": (
            lambda g: 2 <= g <= MAX_GROUP_SIZE,
            f"must be at least 2 and at most {MAX_GROUP_SIZE}: advantages compare the completions "
            "of a group",
        ),
        "prompts_per_lease": (lambda n: n >= 1, "must be at least 1"),
        "weight_sync_steps": (lambda n: n >= 1, "must be at least 1"),
        "max_staleness": (lambda n: n >= 0, "must be at least 0 (0 is synchronous GRPO)"),
        "max_attempts": (lambda n: n >= 1, "must be at least 1"),
        "max_versions": (
            lambda n: 1 <= n <= INT_MAX,
            f"must be between 1 and {INT_MAX:,} when set",
        ),
        "lease_ttl_s": (lambda x: 0 < x <= 86_400, "must be greater than 0 and at most a day"),
        "budget_usd": (lambda x: x > 0, "must be greater than 0 when set"),
        "learner_price_per_hour": (
            lambda x: 0 <= x <= MAX_LEARNER_PRICE_PER_HOUR,
            f"must be between 0 and {MAX_LEARNER_PRICE_PER_HOUR:,.0f} USD per hour",
        ),
        "seed": SEED_RULE,
        "priority": (lambda p: -1_000_000 <= p <= 1_000_000, "must be in ±1,000,000"),
    }

    @field_validator("prompts_per_step")
    @classmethod
    def _multiple_of_lease(cls, n: int, info: ValidationInfo) -> int:
        per_lease = info.data.get("prompts_per_lease")
        if n < 1:
            raise _fail(f"prompts_per_step must be at least 1 (got {n})")
        if per_lease is not None and n % per_lease != 0:
            raise _fail(
                f"prompts_per_step must be a multiple of prompts_per_lease ({per_lease}): "
                f"an optimizer step takes whole leases (got {n})"
            )
        return n

    @field_validator("epochs")
    @classmethod
    def _epochs(cls, n: int, info: ValidationInfo) -> int:
        if n < 1:
            raise _fail(f"epochs must be at least 1 (got {n})")
        dataset = info.data.get("dataset")
        if dataset is not None and n * dataset.n_rows() > MAX_PROMPT_ROWS:
            raise _fail(
                f"epochs × dataset rows must be at most {MAX_PROMPT_ROWS:,}: every epoch's "
                f"prompt rows are created up front (got {n} × {dataset.n_rows():,})"
            )
        return n

    @field_validator("max_staleness")
    @classmethod
    def _admission_bound_fits(cls, n: int, info: ValidationInfo) -> int:
        steps = info.data.get("weight_sync_steps")
        per_step = info.data.get("prompts_per_step")
        if steps is not None and per_step is not None:
            bound = (n + 1) * steps * per_step
            if bound > MAX_ADMISSION_BOUND:
                raise _fail(
                    f"(max_staleness + 1) × weight_sync_steps × prompts_per_step must be at "
                    f"most {MAX_ADMISSION_BOUND:,}: it bounds the groups in flight (got {bound:,})"
                )
        return n

    @field_validator("heartbeat_interval_s")
    @classmethod
    def _heartbeat_below_ttl(cls, x: float, info: ValidationInfo) -> float:
        ttl = info.data.get("lease_ttl_s")
        if x <= 0:
            raise _fail(f"heartbeat_interval_s must be greater than 0 (got {x!r})")
        if ttl is not None and not x < ttl:
            raise _fail(
                f"heartbeat_interval_s must be less than lease_ttl_s ({ttl!r}), or leases "
                f"expire between heartbeats (got {x!r})"
            )
        return x

    @field_validator("eval")
    @classmethod
    def _accuracy_reward_is_a_reward(
        cls, ev: EvalConfig | None, info: ValidationInfo
    ) -> EvalConfig | None:
        specs = info.data.get("rewards")
        if ev is None or specs is None:
            return ev
        names = [r.name for r in specs]
        if ev.accuracy_reward not in names:
            raise _fail(
                f"eval.accuracy_reward must name one of the run's rewards ({', '.join(names)}) "
                f"(got {ev.accuracy_reward!r})"
            )
        return ev

    def admission_bound_groups(self) -> int:
        """Groups that may be leased, accepted or claimed (not yet consumed) at once."""
        return (self.max_staleness + 1) * self.weight_sync_steps * self.prompts_per_step
