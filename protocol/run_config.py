"""The run configuration: everything a run needs, validated at creation with precise messages.

Shared by server (validation, admission units), worker (sampling) and learner (LoRA, loss).
Field names are part of the public API (examples/runs/*.json, CI pipelines).

Every rule below produces an error at the field's path whose message names the field, the rule
and the value received, e.g. `group_size must be at least 2 ... (got 1)`. Unknown fields are
refused at every nesting level.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlparse

from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from protocol import datasets, rewards
from protocol.config_base import MAX_LORA_RANK, Rule, _fail, _Strict
from protocol.environments import SINGLE_TURN, EnvironmentConfig
from protocol.schemas import BIGINT_MAX, INT_MAX, KIB, MAX_MODEL_NAME, free_json
from protocol.tracking import TrackingConfig

MAX_NEW_TOKENS = 8192
MAX_PROMPT_ROWS = 5_000_000  # epochs × dataset rows, all created up front
MAX_ROW_BYTES = 1024 * KIB  # one dataset row as JSON
# An inline dataset lives in the run's config: small, or it belongs in an uploaded dataset.
MAX_INLINE_ROWS = datasets.MAX_JSONL_ROWS
MAX_INLINE_BYTES = 1024 * KIB
MAX_COLUMN_NAME = 200
MAX_LEARNER_PRICE_PER_HOUR = 10_000.0  # USD; far above any GPU box, far below float overflow
_SAMPLED = "behaviour log-probs must describe the distribution actually sampled"

# The loss options (GrpoConfig), the learner's loss and advantages take the same types.
LossType = Literal["dapo", "grpo", "dr_grpo", "cispo"]
ImportanceLevel = Literal["token", "sequence"]
Correction = Literal["none", "tis"]
ScaleRewards = Literal["group", "none"]
LrSchedule = Literal["constant", "linear", "cosine"]


# torch.manual_seed and random.seed take it: a non-negative signed 64-bit integer.
SEED_RULE: Rule = (lambda n: 0 <= n <= BIGINT_MAX, f"must be between 0 and {BIGINT_MAX:,}")

# Completions per prompt: bounded so that a group's counts stay far inside the database's
# integer columns (an unbounded G was accepted, then every lease acquire failed with a 500).
MAX_GROUP_SIZE = 1024
# Run.groups_in_flight is an INTEGER column compared with the admission bound.
MAX_ADMISSION_BOUND = INT_MAX


class RewardSpec(_Strict):
    """One reward function and its weight in the total reward."""

    name: str = Field(
        description="A built-in reward name, an entry-point name or 'module:function' for user "
        f"code (at most {rewards.MAX_NAME_CHARS} characters)."
    )
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
            raise PydanticCustomError(exc.code, str(exc)) from None
        return name

    @field_validator("kwargs")
    @classmethod
    def _builtin_kwargs(cls, kwargs: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("name")
        if name is not None:
            try:
                rewards.check_kwargs(name, kwargs)
            except rewards.RewardError as exc:
                if exc.kwarg is None:
                    raise PydanticCustomError(exc.code, str(exc)) from None
                # the error's path names the kwarg: rewards.0.kwargs.max_chars
                at_kwarg = InitErrorDetails(
                    type=PydanticCustomError(exc.code, str(exc)),
                    loc=(exc.kwarg,),
                    input=kwargs[exc.kwarg],
                )
                raise ValidationError.from_exception_data(cls.__name__, [at_kwarg]) from None
        return kwargs


class GeneratorDataset(_Strict):
    """Prompts made by a built-in generator with a seed."""

    kind: Literal["generator"] = Field("generator", description="Prompts from a generator.")
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

    def n_rows(self) -> int | None:
        return self.size

    def known_reference_columns(self) -> set[str] | None:
        """The reference columns every row has (None: known to the server only)."""
        return set(datasets.generate(self.generator, 1, 0)[0]) - {"prompt"}


def _check_row(row: dict[str, Any]) -> dict[str, Any]:
    try:
        return datasets.check_row(row)
    except datasets.DatasetError as exc:
        raise _fail(str(exc)) from None


class InlineDataset(_Strict):
    """Rows given at creation (JSONL): a `prompt` column plus reference columns. Small only
    (it is kept in the run's config): anything larger is an uploaded dataset."""

    kind: Literal["jsonl"] = Field("jsonl", description="Rows inline in the run's config.")
    rows: list[
        Annotated[
            dict[str, Any], AfterValidator(free_json(MAX_ROW_BYTES)), AfterValidator(_check_row)
        ]
    ] = Field(
        description=f"Dataset rows (at most {MAX_INLINE_ROWS:,} and {MAX_INLINE_BYTES // KIB:,} "
        "KiB as JSON in all; larger datasets are uploaded, POST /api/v1/datasets); each has "
        "`prompt` (a non-empty string or chat messages {role, content} with roles "
        "system/user/assistant) and reference columns that only the learner's rewards see; "
        "nested at most 32 levels, with finite numbers only."
    )

    @field_validator("rows", mode="before")
    @classmethod
    def _row_count(cls, rows: Any) -> Any:
        # Before per-row validation, so an oversized dataset fails fast with one message.
        if not isinstance(rows, list):
            return rows
        if not 1 <= len(rows) <= MAX_INLINE_ROWS:
            raise _fail(
                f"rows must hold between 1 and {MAX_INLINE_ROWS:,} rows (got {len(rows):,}); "
                "use an uploaded dataset (POST /api/v1/datasets) for more"
            )
        size = _json_size(rows)
        if size > MAX_INLINE_BYTES:
            raise _fail(
                f"inline rows must be at most {MAX_INLINE_BYTES:,} bytes as JSON (got "
                f"{size:,}); use an uploaded dataset (POST /api/v1/datasets)"
            )
        return rows

    def n_rows(self) -> int | None:
        return len(self.rows)

    def known_reference_columns(self) -> set[str] | None:
        return set().union(*(set(row) for row in self.rows)) - {"prompt"}


def _json_size(value: Any) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError):
        return 0  # not JSON at all: the per-row validation says why


def _column(name: str) -> str:
    if not 1 <= len(name) <= MAX_COLUMN_NAME:
        raise _fail(f"a column name must be 1 to {MAX_COLUMN_NAME} characters (got {name!r})")
    return name


Column = Annotated[str, AfterValidator(_column)]


class _MappedDataset(_Strict):
    """Column mapping of a stored dataset (uploaded or Hugging Face)."""

    prompt_column: Column = Field(
        "prompt",
        description="Column holding the prompt: a non-empty string, or chat messages "
        "[{role, content}] with roles system/user/assistant.",
    )
    system_prompt: str | None = Field(
        None,
        description="System message put before string prompts of this dataset (stored with "
        "each prompt, so it replaces grpo.system_prompt for them); chat-message prompts are "
        "used as they are. None: grpo.system_prompt applies.",
    )
    reference_columns: list[Column] | None = Field(
        None,
        description="Columns passed to the rewards as references (never sent to workers). "
        "None: every column except the prompt column.",
    )

    def n_rows(self) -> int | None:
        return None  # known to the server only, once the dataset is ready

    def known_reference_columns(self) -> set[str] | None:
        return None if self.reference_columns is None else set(self.reference_columns)

    def columns_needed(self) -> list[str]:
        return [self.prompt_column, *(self.reference_columns or [])]


class UploadedDataset(_MappedDataset):
    """A dataset uploaded with POST /api/v1/datasets (JSONL or Parquet), by its id."""

    kind: Literal["uploaded"] = Field(
        "uploaded", description="A dataset stored by POST /api/v1/datasets."
    )
    id: uuid.UUID = Field(description="The dataset's id, as POST /api/v1/datasets answered.")


_HF_TEXT = (lambda s: 1 <= len(s) <= 500, "must be 1 to 500 characters")


def _local(value: str) -> bool:
    """Not a URL nor an fsspec chain: the `datasets` library would fetch those itself, past the
    outbound policy every address a run names goes through."""
    return "://" not in value and "::" not in value


_WHAT = {"path": "a Hub id, a loader name or a path on the server", "data_files": "server paths"}
_NO_URL = (
    "not a URL: the server would fetch it past the outbound policy (upload the file with "
    "POST /api/v1/datasets instead)"
)


class HfDataset(_MappedDataset):
    """A Hugging Face dataset the server loads once with the `datasets` library into the
    bucket (as Parquet, with the library's fingerprint). Offline, `path` may be a local folder,
    or a loader name ("json", "parquet", "csv") with `data_files`."""

    kind: Literal["hf"] = Field("hf", description="A Hugging Face dataset the server loads.")
    path: str = Field(description="Hub id (openai/gsm8k), a local folder, or a loader name.")
    name: str | None = Field(None, description="Configuration name (e.g. main).")
    split: str = Field("train", description="Split to load (e.g. train, test, train[:1000]).")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    data_files: str | list[str] | None = Field(
        None, description="Data files for a loader path (json, parquet, csv): paths or globs."
    )

    RULES: ClassVar[dict[str, Rule]] = {
        "path": _HF_TEXT,
        "name": _HF_TEXT,
        "split": _HF_TEXT,
        "revision": _HF_TEXT,
    }

    @field_validator("path", "data_files")
    @classmethod
    def _no_urls(cls, value: str | list[str] | None, info: ValidationInfo) -> Any:
        for item in [value] if isinstance(value, str) else value or []:
            if not _local(item):
                field = info.field_name or "path"
                raise _fail(f"{field} must be {_WHAT[field]}, {_NO_URL} (got {item!r})")
        return value

    def spec(self) -> dict[str, Any]:
        """What identifies the loaded data (the column mapping does not)."""
        return self.model_dump(
            mode="json", include={"kind", "path", "name", "split", "revision", "data_files"}
        )


DatasetSpec = Annotated[
    GeneratorDataset | InlineDataset | UploadedDataset | HfDataset,
    Field(discriminator="kind"),
]
StoredDataset = UploadedDataset | HfDataset


class RowsOmitted(_Strict):
    """What a learner receives in place of an inline dataset at attach: it never needs rows
    (each claim carries its prompts and references)."""

    kind: Literal["rows_omitted"] = Field(
        "rows_omitted", description="An inline dataset whose rows were left out."
    )
    rows: int = Field(description="Number of inline rows the run has.")

    def n_rows(self) -> int | None:
        return self.rows

    def known_reference_columns(self) -> set[str] | None:
        return None


def omit_rows(dataset: Any) -> Any:
    """The dataset as a learner sees it: inline rows replaced by their count."""
    if isinstance(dataset, InlineDataset):
        return RowsOmitted(rows=len(dataset.rows))
    return dataset


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
        "epsilon_low": (lambda x: x >= 0, "must be at least 0"),  # < 1 unless cispo: below
        "epsilon_high": (lambda x: x >= 0, "must be at least 0"),
        "beta": (lambda x: x >= 0, "must be at least 0"),
        "tis_cap": (lambda x: x >= 1, "must be at least 1"),
        "micro_batch_tokens": (lambda x: x >= 1, "must be at least 1"),
        "spot_check_fraction": (lambda x: 0 <= x <= 1, "must be in [0, 1]"),
        "warmup_steps": (lambda n: 0 <= n <= INT_MAX, f"must be between 0 and {INT_MAX:,}"),
        "lr_decay_steps": (
            lambda n: 1 <= n <= INT_MAX,
            f"must be between 1 and {INT_MAX:,} when set",
        ),
        "min_lr_ratio": (lambda x: 0 <= x <= 1, "must be in [0, 1]"),
    }

    learning_rate: float = Field(5e-4, description="AdamW learning rate (the peak of a schedule).")
    lr_schedule: LrSchedule = Field(
        "constant",
        description="Learning-rate schedule after the warm-up: constant, or linear or cosine "
        "decay from learning_rate to min_lr_ratio × learning_rate at lr_decay_steps.",
    )
    warmup_steps: int = Field(
        0, description="Optimizer steps of linear warm-up from 0 to learning_rate (0: none)."
    )
    lr_decay_steps: int | None = Field(
        None,
        description="The optimizer step at which a linear or cosine decay reaches its floor "
        "(None: max_versions × weight_sync_steps, the run's last step).",
    )
    min_lr_ratio: float = Field(
        0.0, description="The decay's floor as a share of learning_rate, held after lr_decay_steps."
    )
    weight_decay: float = Field(0.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, description="Gradient-norm clip.")
    epsilon_low: float = Field(
        0.2, description="Lower clip ε_low of the ratio; ≥ 1 (no lower clip) for cispo only."
    )
    epsilon_high: float = Field(0.28, description="Upper clip ε_high of the ratio.")
    loss_type: LossType = Field(
        "dapo",
        description="Aggregation (dapo, grpo, dr_grpo), or cispo: MiniMax-M1's clipped "
        "importance-weight loss, aggregated as dapo.",
    )
    importance_level: ImportanceLevel = Field(
        "token",
        description="Ratio of the clipped surrogate: per token, or per sequence (GSPO: "
        "exp of the mean log-ratio over the completion).",
    )
    scale_rewards: ScaleRewards = Field("group", description="Advantage scaling.")
    beta: float = Field(0.0, description="KL coefficient to the base model (k3 estimator).")
    correction: Correction = Field("none", description="Off-policy correction.")
    tis_cap: float = Field(2.0, description="Truncation cap C of TIS.")
    micro_batch_tokens: int = Field(4096, description="Token budget of one micro-batch.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for memory.")
    spot_check_fraction: float = Field(
        0.05, description="Share of batches re-scored by the learner."
    )
    system_prompt: str | None = Field(
        "You are a helpful assistant.", description="System message for string prompts."
    )

    @model_validator(mode="after")
    def _loss_combination(self) -> GrpoConfig:
        refused = loss_combination_errors(
            self.loss_type, self.importance_level, self.correction, self.epsilon_low
        )
        if refused:
            details = [
                InitErrorDetails(type=_fail(msg), loc=(field,), input=getattr(self, field))
                for field, msg in refused
            ]
            raise ValidationError.from_exception_data(type(self).__name__, details)
        return self


# The reasons a combination of loss options is refused (docs/guides/run-config.md, "The GRPO loss").
_CISPO_TIS = (
    "correction 'tis' cannot be combined with loss_type 'cispo': CISPO already weights each "
    "token by the truncated, gradient-stopped ratio sg(clip(ρ, 1 − epsilon_low, 1 + "
    "epsilon_high)) to the same behaviour log-probs, so a TIS cap C is epsilon_high = C − 1; "
    "use correction 'none' (got 'tis')"
)
_SEQUENCE_CISPO = (
    "importance_level 'sequence' cannot be combined with loss_type 'cispo': CISPO clips each "
    "token's own weight so that no token loses its gradient; a sequence-level ratio is GSPO, "
    "a clipped surrogate: use loss_type 'grpo' (the GSPO paper's), 'dapo' or 'dr_grpo' "
    "(got 'sequence')"
)
_SEQUENCE_TIS = (
    "importance_level 'sequence' cannot be combined with correction 'tis': TIS replaces the "
    "clipped surrogate by a per-token truncated weight, and the sequence-level ratio (GSPO) "
    "exists only in the clipped surrogate; use correction 'none' (got 'sequence')"
)


def loss_combination_errors(
    loss_type: str, importance_level: str, correction: str, epsilon_low: float
) -> list[tuple[str, str]]:
    """The refused combinations of the loss options, as (field, message); empty when the
    combination is valid. docs/guides/run-config.md, "The GRPO loss", tabulates every combination;
    β and dr_grpo combine with all that is valid here."""
    out = []
    if epsilon_low >= 1 and loss_type != "cispo":
        message = (
            f"epsilon_low must be in [0, 1) with loss_type {loss_type!r}: with "
            "1 − epsilon_low ≤ 0 the clipped surrogate never clips from below; only loss_type "
            f"'cispo' allows epsilon_low ≥ 1, its weight then clipped from above only "
            f"(got {epsilon_low!r})"
        )
        out.append(("epsilon_low", message))
    if loss_type == "cispo" and correction == "tis":
        out.append(("correction", _CISPO_TIS))
    if importance_level == "sequence" and loss_type == "cispo":
        out.append(("importance_level", _SEQUENCE_CISPO))
    if importance_level == "sequence" and correction == "tis":
        out.append(("importance_level", _SEQUENCE_TIS))
    return out


MAX_EVAL_PROMPTS = 100_000
MAX_EVAL_SAMPLES = 1024
MAX_EVAL_LEASES = 1024


class EvalConfig(_Strict):
    """Held-out evaluation during training: versions 0, k, 2k, … and the final version are
    sampled on the eval prompts and scored with the run's rewards (docs/guides/evaluation.md)."""

    dataset: DatasetSpec = Field(
        description="The held-out prompts (e.g. a test split): any dataset kind, with its own "
        "column mapping for stored kinds."
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
        rows = dataset.n_rows() if dataset is not None else None  # stored: known later
        if n is None and rows is not None and rows > MAX_EVAL_PROMPTS:
            raise _fail(
                f"max_prompts must be set when the eval dataset has more than "
                f"{MAX_EVAL_PROMPTS:,} rows: every evaluated version samples each eval prompt "
                f"(got {rows:,} rows)"
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

    def check_stored_rows(self, rows: int) -> None:
        """A stored eval dataset of `rows` rows, once the server knows its size: without
        max_prompts, at most MAX_EVAL_PROMPTS rows (as for the other kinds)."""
        if self.max_prompts is None and rows > MAX_EVAL_PROMPTS:
            raise _fail(
                f"max_prompts must be set when the eval dataset has more than "
                f"{MAX_EVAL_PROMPTS:,} rows: every evaluated version samples each eval prompt "
                f"(got {rows:,} rows)"
            )

    def n_prompts(self) -> int | None:
        """Eval prompts per evaluated version (None: a stored dataset's size, which only the
        server knows, bounded by max_prompts)."""
        rows = self.dataset.n_rows()
        if rows is None:
            return self.max_prompts
        return rows if self.max_prompts is None else min(rows, self.max_prompts)


def _http_url(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme in ("http", "https") and bool(parsed.netloc)


BestMetric = Literal["eval_accuracy", "eval_mean_reward", "eval_pass_at_n", "train_reward"]
EVAL_METRICS: tuple[BestMetric, ...] = ("eval_accuracy", "eval_mean_reward", "eval_pass_at_n")
MAX_WINDOW_VERSIONS = 1000


class BestConfig(_Strict):
    """Which version is the run's best, by which figure (docs/guides/best-version.md): kept by
    retention and served as `/adapters/best`."""

    metric: BestMetric | None = Field(
        None,
        description="The figure that ranks versions: eval_accuracy, eval_mean_reward or "
        "eval_pass_at_n (each needs an eval block; a version is ranked when its eval is "
        "done), or train_reward (the mean of the learner's reward_mean over the last "
        "window_versions published versions, ranked at each publish). None: eval_accuracy when "
        "the run has an eval block, else train_reward.",
    )
    direction: Literal["max", "min"] = Field(
        "max", description="max: a higher figure is better; min: a lower one."
    )
    window_versions: int = Field(
        4,
        description="train_reward only: how many published versions its mean spans (a version "
        "is ranked once that many are published).",
    )

    RULES: ClassVar[dict[str, Rule]] = {
        "window_versions": (
            lambda n: 1 <= n <= MAX_WINDOW_VERSIONS,
            f"must be between 1 and {MAX_WINDOW_VERSIONS}",
        ),
    }


class EarlyStopConfig(_Strict):
    """Complete the run instead of training on once its best figure stops improving
    (docs/guides/best-version.md); at least one rule must be set."""

    patience: int | None = Field(
        None,
        description="Complete the run when this many versions have been ranked after the best "
        "one without beating it (None: no such rule).",
    )
    max_drop: float | None = Field(
        None,
        description="Complete the run when a ranked version's figure is this much worse than "
        "the best one's, in the figure's own units (None: no such rule).",
    )
    min_version: int = Field(
        0, description="Neither rule stops the run before this version is ranked."
    )

    RULES: ClassVar[dict[str, Rule]] = {
        "patience": (lambda n: 1 <= n <= INT_MAX, f"must be between 1 and {INT_MAX:,} when set"),
        "max_drop": (lambda x: 0 < x < 1e12, "must be greater than 0 when set"),
        "min_version": (lambda n: 0 <= n <= INT_MAX, f"must be between 0 and {INT_MAX:,}"),
    }

    @model_validator(mode="after")
    def _a_rule(self) -> EarlyStopConfig:
        if self.patience is None and self.max_drop is None:
            raise _fail("early_stop needs patience or max_drop (or both)")
        return self


class RetentionConfig(_Strict):
    """What retention keeps beyond invariant 13's versions (the window, the final and the best
    version, the resume checkpoint)."""

    keep_every: int | None = Field(
        None,
        description="Also keep every version that is a multiple of this (snapshots; None: "
        "none beyond invariant 13).",
    )

    RULES: ClassVar[dict[str, Rule]] = {
        "keep_every": (lambda n: 1 <= n <= INT_MAX, f"must be between 1 and {INT_MAX:,} when set"),
    }


class AlarmConfig(_Strict):
    """Drift-alarm thresholds and where to send alarms."""

    RULES: ClassVar[dict[str, Rule]] = {
        "stale_waste": (lambda x: 0 < x <= 1, "must be a fraction in (0, 1]"),
        "clip_fraction": (lambda x: 0 < x <= 1, "must be a fraction in (0, 1]"),
        "no_version_minutes": (lambda x: x > 0, "must be greater than 0"),
        "spot_check_mismatch": (lambda x: x > 0, "must be greater than 0"),
        "window_minutes": (lambda x: 0 < x <= 24 * 60, "must be in (0, 1440] minutes"),
        "webhook_url": (_http_url, "must be an http:// or https:// URL with a host"),
        "entropy_floor": (lambda x: 0 < x <= 100, "must be in (0, 100] nats when set"),
        "entropy_drop": (lambda x: 0 < x < 1, "must be a fraction in (0, 1) when set"),
        "zero_advantage": (lambda x: 0 < x <= 1, "must be a fraction in (0, 1] when set"),
        "zero_advantage_versions": (
            lambda n: 1 <= n <= MAX_WINDOW_VERSIONS,
            f"must be between 1 and {MAX_WINDOW_VERSIONS}",
        ),
    }

    stale_waste: float = Field(0.2, description="Stale-waste fraction that raises the drift alarm.")
    clip_fraction: float = Field(0.2, description="Clip fraction (low+high) that raises an alarm.")
    no_version_minutes: float = Field(30.0, description="Alarm when no version for this long.")
    spot_check_mismatch: float = Field(
        0.05, description="Mean |Δ log-prob| above which a worker is quarantined."
    )
    window_minutes: float = Field(10.0, description="Sliding window for stale waste.")
    webhook_url: str | None = Field(None, description="POSTed a signed JSON event on alarms.")
    entropy_floor: float | None = Field(
        0.1,
        description="Entropy alarm: the learner's entropy (nats per trained token, the mean over "
        "the newest version's steps) under this (None: no floor).",
    )
    entropy_drop: float | None = Field(
        0.9,
        description="Entropy alarm: the newest version's entropy this fraction or more below the "
        "run's first reported one (0.9: at most a tenth of it; None: no such rule).",
    )
    zero_advantage: float | None = Field(
        0.8,
        description="Zero-advantage alarm: the share of groups with no advantage (every "
        "completion scored alike) at or above this in each of the newest "
        "zero_advantage_versions versions (None: no such alarm).",
    )
    zero_advantage_versions: int = Field(
        3, description="How many consecutive versions the zero-advantage share must stay high."
    )


def missing_reward_column(
    rewards_: list[RewardSpec], have: set[str] | None, where: str
) -> str | None:
    """Why a reward cannot work on a dataset whose reference columns are `have` (None: not
    known here), naming the reward, the column and the columns that exist."""
    if have is None:
        return None
    for i, spec in enumerate(rewards_):
        needed = rewards.columns_read(spec.name, spec.kwargs) or set()
        missing = sorted(needed - have)
        if missing:
            listed = ", ".join(sorted(have)) or "none"
            return (
                f"rewards.{i} ({spec.name}) reads the reference column {missing[0]!r}, which "
                f"{where} does not have (its reference columns: {listed})"
            )
    return None


_SERVER_ONLY = ("best", "early_stop", "retention")
_SCHEDULE_FIELDS = ("lr_schedule", "warmup_steps", "lr_decay_steps", "min_lr_ratio")


class RunConfig(_Strict):
    """A complete run: model, data, rewards, LoRA, GRPO, sampling, units of work, limits."""

    name: str = Field(description="Human-readable run name.")
    base_model: str = Field(description="HF id, local folder, or alias smollm2-135m-instruct.")
    dataset: DatasetSpec = Field(
        description="Where the prompts come from: generator, jsonl (inline, small), uploaded "
        "(POST /api/v1/datasets) or hf (a Hugging Face dataset)."
    )
    rewards: list[RewardSpec] = Field(description="Reward functions with weights.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter.")
    grpo: GrpoConfig = Field(default_factory=GrpoConfig, description="GRPO and loss options.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling.")
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig,
        description="The environment a trajectory comes from (default single_turn: one "
        "completion per prompt); workers that cannot run it are not leased the run's prompts.",
    )
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
    best: BestConfig = Field(
        default_factory=BestConfig,
        description="The figure that ranks versions; the best one is kept and served.",
    )
    early_stop: EarlyStopConfig | None = Field(
        None, description="Complete the run once its best figure stops improving (None: never)."
    )
    retention: RetentionConfig = Field(
        default_factory=RetentionConfig, description="Versions kept beyond invariant 13's."
    )
    tracking: TrackingConfig | None = Field(
        None,
        description="Mirror the learner's per-step metrics, eval results and run config to "
        "W&B, trackio or MLflow (None: none, unless the learner's --tracking-backend names "
        "one; its --tracking-* flags override these fields).",
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

    @field_validator("environment")
    @classmethod
    def _environment_fits_sampling(
        cls, env: EnvironmentConfig, info: ValidationInfo
    ) -> EnvironmentConfig:
        sampling = info.data.get("sampling")
        total = env.max_total_tokens
        if sampling is not None and total is not None and sampling.max_new_tokens >= total:
            raise _fail(
                f"environment.max_total_tokens ({total}) must be above sampling.max_new_tokens "
                f"({sampling.max_new_tokens}): a trajectory holds the prompt and at least one "
                "model turn"
            )
        specs = info.data.get("rewards") or []
        scored = [i for i, r in enumerate(specs) if r.name == rewards.WORKER_SCORE]
        if scored and not env.requires_trusted_worker:
            raise _fail(
                f"rewards.{scored[0]} is worker_score, a score written by the worker: the run "
                "must set environment.requires_trusted_worker, so that only workers an admin "
                "trusts roll it out"
            )
        return env

    @property
    def lr_decay_end(self) -> int | None:
        """The optimizer step at which the learning-rate decay reaches its floor."""
        if self.grpo.lr_decay_steps is not None:
            return self.grpo.lr_decay_steps
        if self.max_versions is None:
            return None
        return self.max_versions * self.weight_sync_steps

    @model_validator(mode="after")
    def _lr_schedule_has_an_end(self) -> RunConfig:
        g, end = self.grpo, self.lr_decay_end
        message = None
        if g.lr_schedule != "constant" and end is None:
            message = (
                f"lr_schedule {g.lr_schedule!r} decays to its floor at lr_decay_steps: set it, "
                "or set max_versions (the decay then ends at the run's last step)"
            )
        elif g.lr_schedule != "constant" and end is not None and end <= g.warmup_steps:
            source = "lr_decay_steps" if g.lr_decay_steps else "max_versions × weight_sync_steps"
            message = (
                f"the decay must end after the warm-up: its end ({end}, from {source}) must be "
                f"greater than warmup_steps ({g.warmup_steps})"
            )
        if message is None:
            return self
        detail = InitErrorDetails(
            type=_fail(message), loc=("grpo", "lr_decay_steps"), input=g.lr_decay_steps
        )
        raise ValidationError.from_exception_data(type(self).__name__, [detail])

    @property
    def best_metric(self) -> BestMetric:
        """The figure that ranks versions (best.metric, or its default)."""
        if self.best.metric is not None:
            return self.best.metric
        return "eval_accuracy" if self.eval is not None else "train_reward"

    @model_validator(mode="after")
    def _best_metric_is_measured(self) -> RunConfig:
        metric = self.best.metric
        if metric in EVAL_METRICS and self.eval is None:
            detail = InitErrorDetails(
                type=_fail(
                    f"best.metric {metric!r} ranks versions by their eval: the run needs an "
                    "eval block, or use train_reward"
                ),
                loc=("best", "metric"),
                input=metric,
            )
            raise ValidationError.from_exception_data(type(self).__name__, [detail])
        return self

    @property
    def multi_turn(self) -> bool:
        """Trajectories (batch format 2) rather than single completions (format 1)."""
        return self.environment.name != SINGLE_TURN

    @field_validator("epochs")
    @classmethod
    def _epochs(cls, n: int, info: ValidationInfo) -> int:
        if n < 1:
            raise _fail(f"epochs must be at least 1 (got {n})")
        dataset = info.data.get("dataset")
        rows = dataset.n_rows() if dataset is not None else None
        if rows is not None:
            check_prompt_rows(n, rows)
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

    def for_learner(self) -> dict[str, Any]:
        """The config as a learner receives it at attach: no inline rows, no `tracking` when
        unset (LearnerRunConfig parses it)."""
        dumped = self.model_dump(mode="json")
        dumped["dataset"] = omit_rows(self.dataset).model_dump(mode="json")
        if self.eval is not None:
            dumped["eval"]["dataset"] = omit_rows(self.eval.dataset).model_dump(mode="json")
        if self.tracking is None:  # learners from before the field refuse it (extra="forbid")
            del dumped["tracking"]
        for name in _SERVER_ONLY:  # rules of the server alone; older learners refuse them
            del dumped[name]
        for name in _SCHEDULE_FIELDS:  # the same for the learning-rate schedule, when unused
            if getattr(self.grpo, name) == GrpoConfig.model_fields[name].default:
                del dumped["grpo"][name]
        return dumped

    @field_validator("rewards")
    @classmethod
    def _dataset_has_reward_columns(
        cls, specs: list[RewardSpec], info: ValidationInfo
    ) -> list[RewardSpec]:
        dataset = info.data.get("dataset")
        if dataset is not None:
            why = missing_reward_column(specs, dataset.known_reference_columns(), "the dataset")
            if why:
                raise _fail(why)
        return specs

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
        have = ev.dataset.known_reference_columns()
        why = missing_reward_column(specs, have, "the eval dataset")
        if why:
            raise _fail(why)
        return ev

    def admission_bound_groups(self) -> int:
        """Groups that may be leased, accepted or claimed (not yet consumed) at once."""
        return (self.max_staleness + 1) * self.weight_sync_steps * self.prompts_per_step


def check_prompt_rows(epochs: int, rows: int) -> None:
    """epochs × rows within MAX_PROMPT_ROWS (the server checks it again for stored datasets,
    whose row count only it knows)."""
    if epochs * rows > MAX_PROMPT_ROWS:
        raise _fail(
            f"epochs × dataset rows must be at most {MAX_PROMPT_ROWS:,}: every epoch's "
            f"prompt rows are created up front (got {epochs} × {rows:,})"
        )


class LearnerEvalConfig(EvalConfig):
    """EvalConfig as the learner receives it: an inline eval dataset's rows are left out."""

    dataset: Annotated[  # type: ignore[assignment]
        GeneratorDataset | RowsOmitted | UploadedDataset | HfDataset,
        Field(discriminator="kind", description="The eval dataset, without inline rows."),
    ]


class LearnerRunConfig(RunConfig):
    """RunConfig as the learner receives it at attach (RunConfig.for_learner): inline rows of
    the dataset and of the eval dataset are left out."""

    eval: LearnerEvalConfig | None = Field(  # type: ignore[assignment]
        None, description="Held-out evaluation, without inline eval rows."
    )

    dataset: Annotated[  # type: ignore[assignment]
        GeneratorDataset | RowsOmitted | UploadedDataset | HfDataset,
        Field(discriminator="kind", description="The run's dataset, without inline rows."),
    ]
