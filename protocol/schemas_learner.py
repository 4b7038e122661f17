"""Wire models of the learner's calls (attach, heartbeat, claim, reject, uploads, publish,
metrics, spot-checks). Requests forbid unknown fields; responses tolerate new ones."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from protocol.learner_memory import MAX_DIM, ModelShape
from protocol.schemas import BIGINT_MAX, INT_MAX, KIB, ModelName, free_json


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _plain_name(name: str) -> str:
    if name.strip(".") == "":
        raise ValueError("a file name cannot be only dots")
    return name


FileName = Annotated[
    str,
    AfterValidator(_plain_name),
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="A plain file name: letters, digits, '_', '.', '-'; no slashes.",
    ),
]
Sha256Hex = Annotated[
    str, Field(pattern=r"^[0-9a-f]{64}$", description="Lower-case hex SHA-256 of the file.")
]


# The start of attach's 409 detail when the learner cannot load a reward of the run.
MISSING_REWARDS = "this learner cannot load the run's reward"
# Attach's 409 while the run's prompt rows are being made: the learner waits and retries.
PREPARING = "the run is preparing its prompt rows"

RewardName = Annotated[
    str,
    Field(min_length=1, max_length=300, description="A reward name, or `module:*`."),
]


class AttachRequest(_Request):
    tokenizer_fingerprint: str = Field(
        min_length=1, max_length=128, description="Fingerprint of the learner's tokenizer."
    )
    name: str = Field("learner", max_length=200, description="A name for this learner process.")
    reward_names: list[RewardName] | None = Field(
        None,
        max_length=1000,
        description="The rewards this learner's host allows (protocol/rewards.py "
        "RewardAllowlist.names): built-ins, entry-point names of the group asyncgrpo.rewards "
        "and `module:*` for each allowed module. A run naming another reward is failed at "
        "attach (409). None (an older learner): not checked at attach.",
    )
    model: ModelName | None = Field(
        None,
        description="The base model this learner loaded (its --model); when given, attach is "
        "refused (409) unless it is the run's base_model.",
    )


class StoredFile(_Response):
    """One object of a published version, with a short-lived download URL."""

    name: str = Field(description="File name inside the version's folder.")
    key: str = Field(description="Bucket key.")
    sha256: str = Field(description="SHA-256 recorded at publish.")
    size: int = Field(description="Size in bytes.")
    url: str = Field(description="Presigned GET URL.")


class AttachResponse(_Response):
    fencing: int = Field(description="This learner's fencing token; sent with every call.")
    current_version: int = Field(description="The run's last published adapter version.")
    resume_checkpoint: list[StoredFile] | None = Field(
        description="Checkpoint files (optimizer, scheduler, RNG, step) of the latest version at "
        "or below the current one that has any, or None when no version has (always at version "
        "0). Restore them with the current version's adapter weights."
    )
    resume_checkpoint_version: int | None = Field(
        None, description="The version resume_checkpoint was published with; None without one."
    )
    resume_adapter: list[StoredFile] | None = Field(
        description="Adapter files of the current version, or None at version 0."
    )
    resume_learner_step: int | None = Field(
        None,
        description="Optimizer steps taken when the current version was published; None "
        "at version 0.",
    )
    run_config: dict[str, Any] = Field(description="The run's RunConfig as JSON.")
    run_status: str | None = Field(
        None,
        description="The run's status after the attach: `evaluating` means training is done "
        "and only eval batches remain to score.",
    )
    heartbeat_interval_s: float = Field(description="How often to heartbeat.")
    lease_ttl_s: float = Field(description="The learner lease lapses this long after a call.")


class FencedRequest(_Request):
    fencing: int = Field(ge=0, le=BIGINT_MAX, description="The fencing token attach returned.")


class HeartbeatRequest(FencedRequest):
    pass


class HeartbeatResponse(_Response):
    current_version: int = Field(description="The run's last published version.")
    status: str = Field(description="The run's status.")


class ClaimRequest(FencedRequest):
    max_groups: int = Field(ge=1, le=100_000, description="Most prompt groups to hand out.")
    wait_s: float = Field(
        0.0, ge=0.0, le=600.0, description="Long-poll: wait up to this long (capped) for work."
    )
    target_version: int | None = Field(
        None,
        ge=1,
        le=INT_MAX,
        description="The version the learner will train these batches into: current_version + 1 "
        "to current_version + 3 (one version uploading, one step training, the next prefetched). "
        "The staleness window is checked against it; None means current_version + 1. 409 once a "
        "publish has made it ≤ current_version, 422 above current_version + 3.",
    )


class PromptRowOut(_Response):
    prompt_row_id: int = Field(description="PromptRow id (the batch's prompt id).")
    dataset_row_id: int = Field(description="DatasetRow id.")
    prompt: Any = Field(description="The prompt: text or chat messages.")
    reference: dict[str, Any] = Field(description="Reference columns for the rewards.")
    epoch: int = Field(description="Epoch of this prompt row.")


class ClaimedBatch(_Response):
    batch_id: uuid.UUID = Field(description="RolloutBatch id.")
    lease_id: uuid.UUID = Field(description="The lease that produced it.")
    worker_id: uuid.UUID = Field(description="The worker that produced it.")
    adapter_version: int = Field(description="Adapter version the batch was generated with.")
    staleness: int = Field(
        description="(target_version - 1) - adapter_version: how far behind the batch is trained "
        "when published into target_version."
    )
    target_version: int = Field(
        description="The version the batch was claimed to be trained into; a publish may consume "
        "it into this version or an earlier one, never a later one."
    )
    bucket_key: str = Field(description="Bucket key of the Parquet file.")
    sha256: str = Field(description="SHA-256 the worker declared; verify on download.")
    size: int = Field(description="Size in bytes.")
    url: str = Field(description="Presigned GET URL.")
    n_samples: int = Field(description="Completions in the batch.")
    n_groups: int = Field(description="Prompt groups in the batch.")
    prompts: list[PromptRowOut] = Field(description="The batch's prompt rows.")


class ClaimResponse(_Response):
    batches: list[ClaimedBatch] = Field(description="Batches now claimed by this learner.")
    exhausted: bool = Field(description="Nothing left to lease or in flight but what you hold.")
    current_version: int = Field(description="The run's last published version.")
    stale_rejected: int = Field(0, description="Batches rejected as stale during this claim.")


RejectReason = Literal[
    "checksum", "invalid", "prompt_mismatch", "spot_check", "reward_error", "env_mismatch"
]


class FailRequest(FencedRequest):
    reason: str = Field(
        min_length=1,
        max_length=2000,
        description="What went wrong that a restart cannot fix (e.g. the run's reward function "
        "cannot be imported); shown as the run's status reason.",
    )


class FailResponse(_Response):
    run_status: str = Field(description="The run's status after the report: failed.")


class RejectRequest(FencedRequest):
    reason: RejectReason = Field(description="Why the batch cannot be trained on.")
    detail: str | None = Field(None, max_length=2000, description="Human-readable detail.")


class RejectResponse(_Response):
    batch_id: uuid.UUID = Field(description="The rejected batch.")
    requeued: int = Field(description="Prompt rows put back at the front of the queue.")
    dropped: int = Field(description="Prompt rows dropped after max_attempts.")


FileKind = Literal["adapter", "checkpoint"]


class UploadFile(_Request):
    name: FileName
    size: int = Field(ge=0, le=BIGINT_MAX, description="Exact size in bytes.")
    sha256: Sha256Hex
    kind: FileKind = Field(description="adapter (served to workers) or checkpoint (resume).")


class UploadsRequest(FencedRequest):
    version: int = Field(ge=1, le=INT_MAX, description="The version being published: current + 1.")
    files: list[UploadFile] = Field(min_length=1, max_length=64, description="Files to upload.")


class PresignedUpload(_Response):
    name: str = Field(description="File name.")
    kind: FileKind = Field(description="adapter or checkpoint.")
    key: str = Field(description="Bucket key the URL writes.")
    url: str = Field(description="Presigned PUT URL.")
    headers: dict[str, str] = Field(description="Headers to send exactly (If-None-Match: *).")


class UploadsResponse(_Response):
    uploads: list[PresignedUpload] = Field(description="One presigned PUT per file.")


class PublishedFile(_Request):
    name: FileName
    key: str = Field(max_length=1000, description="Bucket key the file was uploaded to.")
    sha256: Sha256Hex
    size: int = Field(ge=0, le=BIGINT_MAX, description="Size in bytes.")


class PublishRequest(FencedRequest):
    version: int = Field(ge=1, le=INT_MAX, description="Exactly current_version + 1.")
    files: list[PublishedFile] = Field(min_length=1, description="Adapter files (PEFT folder).")
    checkpoint_files: list[PublishedFile] = Field(
        default_factory=list,
        description="Resume state files written under this version; empty for a version that "
        "carries no checkpoint (the learner writes one every checkpoint_every_versions versions "
        "and with the final one).",
    )
    learner_step: int = Field(ge=0, le=INT_MAX, description="Optimizer steps taken so far.")
    metrics: Annotated[dict[str, Any], AfterValidator(free_json(64 * KIB))] = Field(
        default_factory=dict,
        description="Summary metrics: JSON of at most 64 KiB, nested at most 32 levels, finite "
        "numbers only.",
    )
    consumed_batch_ids: list[uuid.UUID] = Field(
        default_factory=list, description="Claimed batches this version was trained on."
    )
    final: bool = Field(False, description="The last version: completes the run.")


class PublishResponse(_Response):
    version: int = Field(description="The published version.")
    run_status: str = Field(description="The run's status after the publish.")
    consumed_batches: int = Field(description="Batches marked consumed.")


class MetricPointIn(_Request):
    step: int = Field(ge=0, le=INT_MAX, description="Learner step.")
    version: int | None = Field(
        None, ge=0, le=INT_MAX, description="Adapter version being trained."
    )
    values: Annotated[dict[str, float | int | None], AfterValidator(free_json(64 * KIB))] = Field(
        description="Named metric values (finite numbers or null; at most 64 KiB as JSON)."
    )


class MetricsRequest(FencedRequest):
    points: list[MetricPointIn] = Field(min_length=1, max_length=10_000, description="Points.")


class MetricsAccepted(_Response):
    stored: int = Field(description="Points stored.")


class SpotCheckRequest(FencedRequest):
    worker_id: uuid.UUID = Field(description="The worker whose batch was re-scored.")
    batch_id: uuid.UUID = Field(description="The batch that was re-scored.")
    mean_abs_logprob_diff: float = Field(
        ge=0.0, allow_inf_nan=False, description="Mean |Δ log-prob| per token."
    )
    kl: float | None = Field(
        None, allow_inf_nan=False, description="Approximate KL(behaviour‖learner)."
    )
    n_tokens: int = Field(ge=0, le=INT_MAX, description="Tokens compared.")


class SpotCheckResponse(_Response):
    worker_id: uuid.UUID = Field(description="The worker.")
    worker_status: str = Field(description="active, quarantined or revoked.")
    spot_checks: int = Field(description="Spot checks recorded for this worker.")
    spot_check_mismatch: float = Field(description="Running mean of mean |Δ log-prob|.")
    quarantined: bool = Field(description="This check quarantined the worker.")


# -- evaluation during training (docs/guides/evaluation.md) ---------------------------------------

MAX_EVAL_CLAIM = 64
MAX_EVAL_SAMPLES_PER_POST = 1 << 18


class EvalClaimRequest(FencedRequest):
    max_batches: int = Field(4, ge=1, le=MAX_EVAL_CLAIM, description="Most eval batches.")
    wait_s: float = Field(
        0.0, ge=0.0, le=600.0, description="Long-poll: wait up to this long (capped) for work."
    )


class EvalPromptOut(_Response):
    item_id: int = Field(description="Eval item id (the batch's prompt_row_id column).")
    eval_row_id: int = Field(description="Eval row id.")
    prompt: Any = Field(description="The prompt: text or chat messages.")
    reference: dict[str, Any] = Field(description="Reference columns for the rewards.")


class ClaimedEvalBatch(_Response):
    batch_id: uuid.UUID = Field(description="RolloutBatch id (kind eval).")
    lease_id: uuid.UUID = Field(description="The eval lease that produced it.")
    worker_id: uuid.UUID = Field(description="The worker that produced it.")
    version: int = Field(description="The adapter version under evaluation (0: base model).")
    bucket_key: str = Field(description="Bucket key of the Parquet file.")
    sha256: str = Field(description="SHA-256 the worker declared; verify on download.")
    size: int = Field(description="Size in bytes.")
    url: str = Field(description="Presigned GET URL.")
    n_samples: int = Field(description="Completions in the batch (prompts × n).")
    n: int = Field(description="Samples per prompt.")
    max_new_tokens: int = Field(description="Completion length limit of the eval.")
    prompts: list[EvalPromptOut] = Field(description="The batch's eval items.")


class EvalClaimResponse(_Response):
    batches: list[ClaimedEvalBatch] = Field(description="Eval batches now claimed.")
    run_status: str = Field(description="The run's status.")
    pending_versions: int = Field(description="Versions whose evaluation is not yet done.")


class EvalSample(_Request):
    item_id: int = Field(ge=0, le=BIGINT_MAX, description="The sample's eval item.")
    reward: float = Field(allow_inf_nan=False, description="Weighted total reward.")
    accuracy_value: float = Field(
        allow_inf_nan=False, description="Value of the eval's accuracy_reward."
    )


class EvalResultsRequest(FencedRequest):
    batch_id: uuid.UUID = Field(description="The claimed eval batch these samples score.")
    samples: list[EvalSample] = Field(
        min_length=1,
        max_length=MAX_EVAL_SAMPLES_PER_POST,
        description="Every sample of the batch: each of its items exactly n times.",
    )


class EvalVersionResult(_Response):
    n_prompts: int = Field(description="Eval prompts scored.")
    n_samples: int = Field(description="Samples scored (prompts × n).")
    mean_reward: float | None = Field(description="Mean total reward over the samples.")
    accuracy: float | None = Field(
        description="Share of samples whose accuracy_reward is at least the threshold."
    )
    pass_at_n: float | None = Field(description="Share of prompts with an accurate sample.")


class EvalResultsResponse(_Response):
    version: int = Field(description="The version the batch evaluated.")
    version_done: bool = Field(description="Every item of that version is now scored.")
    run_status: str = Field(description="The run's status (completed once the last is done).")
    result: EvalVersionResult | None = Field(
        None,
        description="The version's aggregates when this post finished it (version_done); "
        "the learner mirrors them to its tracker. None otherwise, and from older servers.",
    )


# -- pool learners (docs/architecture/protocol.md, "Pool learners") ------------------------------

MAX_POOL_RUNS = 64
MAX_MEMORY_BUDGET_GB = 100_000


class LearnerRegister(_Request):
    name: str = Field(min_length=1, max_length=200, description="Shown on the Learners page.")
    model: ModelName = Field(
        description="The base model it loaded (Hub id): it takes only runs of it."
    )
    tokenizer_fingerprint: str = Field(
        min_length=1,
        max_length=128,
        description="Its tokenizer's fingerprint (lm/chat.py tokenizer_fingerprint): it takes only "
        "runs whose fingerprint is unset or this one.",
    )
    max_runs: int = Field(
        ge=1, le=MAX_POOL_RUNS, description="The most runs it holds at once (1..64)."
    )
    memory_budget_gb: float | None = Field(
        None,
        gt=0,
        le=MAX_MEMORY_BUDGET_GB,
        allow_inf_nan=False,
        description="Memory it may spend on runs, GB (shown on the Learners page; each take's "
        "`memory` is what the take checks).",
    )
    gpu_type: str | None = Field(None, min_length=1, max_length=100, description="e.g. H100.")
    price_per_hour: float | None = Field(
        None, ge=0, le=10_000, description="USD/hour, split over the runs it holds (Cost page)."
    )


class LearnerRegistered(_Response):
    learner_id: uuid.UUID
    learner_token: str = Field(description="The pool_learner token; shown only in this response.")
    project_id: uuid.UUID | None = Field(
        None,
        description="The project it serves (its registration token's); null: the shared fleet, "
        "every project.",
    )


Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]


class LearnerMemory(_Request):
    """A pool learner's memory budget and its base model's shape (from its config.json): the
    take leaves a run that does not fit beside those it holds (protocol/learner_memory.py
    `pool_fit`)."""

    budget_gb: float = Field(
        gt=0,
        le=MAX_MEMORY_BUDGET_GB,
        allow_inf_nan=False,
        description="Memory it may spend, GB (10^9 bytes): its --memory-budget, else the GPU's "
        "(or, on CPU, the machine's) total memory.",
    )
    weight_bytes: Literal[2, 4] = Field(
        2, description="Bytes per base weight and activation: 2 (bfloat16, float16), 4 (float32)."
    )
    layers: Dim = Field(description="config.json num_hidden_layers.")
    hidden: Dim = Field(description="config.json hidden_size.")
    intermediate: Dim = Field(description="config.json intermediate_size.")
    heads: Dim = Field(description="config.json num_attention_heads.")
    kv_heads: Dim = Field(description="config.json num_key_value_heads (divides heads).")
    vocab: Dim = Field(description="config.json vocab_size.")
    head_dim: Dim | None = Field(
        None,
        validate_default=True,
        description="config.json head_dim where it is not hidden ÷ heads (None: hidden ÷ heads, "
        "which heads must then divide).",
    )
    tied_embeddings: bool = Field(False, description="config.json tie_word_embeddings.")
    attention_bias: bool = Field(False, description="A bias on q, k and v (Qwen2).")
    qk_norm: bool = Field(False, description="A norm over each head's q and k (Qwen3).")

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide(cls, kv_heads: int, info: ValidationInfo) -> int:
        heads = info.data.get("heads")
        if heads is not None and heads % kv_heads:
            raise ValueError(f"must divide heads ({heads})")
        return kv_heads

    @field_validator("head_dim")
    @classmethod
    def _head_dim_or_heads_divide(cls, head_dim: int | None, info: ValidationInfo) -> int | None:
        hidden, heads = info.data.get("hidden"), info.data.get("heads")
        if head_dim is None and hidden is not None and heads is not None and hidden % heads:
            raise ValueError(f"must be given: heads ({heads}) does not divide hidden ({hidden})")
        return head_dim

    @classmethod
    def of(cls, shape: ModelShape, *, budget_gb: float, weight_bytes: int) -> LearnerMemory:
        return cls(
            budget_gb=budget_gb,
            weight_bytes=weight_bytes,  # type: ignore[arg-type]  # checked by the model
            layers=shape.layers,
            hidden=shape.hidden,
            intermediate=shape.intermediate,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            vocab=shape.vocab,
            head_dim=shape.explicit_head_dim,
            tied_embeddings=shape.tied_embeddings,
            attention_bias=shape.attention_bias,
            qk_norm=shape.qk_norm,
        )

    def shape(self, name: str) -> ModelShape:
        return ModelShape(
            name=name,
            layers=self.layers,
            hidden=self.hidden,
            intermediate=self.intermediate,
            heads=self.heads,
            kv_heads=self.kv_heads,
            vocab=self.vocab,
            tied_embeddings=self.tied_embeddings,
            attention_bias=self.attention_bias,
            explicit_head_dim=self.head_dim,
            qk_norm=self.qk_norm,
        )


class TakeRequest(_Request):
    max: int = Field(
        ge=1, le=MAX_POOL_RUNS, description="Take at most this many runs (at most its max_runs)."
    )
    memory: LearnerMemory | None = Field(
        None,
        description="Its memory budget and model shape: a run that does not fit beside those "
        "it holds is left (in `left`, with the reason). None: no memory check.",
    )


class TakenRun(_Response):
    run_id: uuid.UUID
    name: str
    status: str
    base_model: str
    tokenizer_fingerprint: str | None = Field(
        description="The run's fingerprint (null until its first attach)."
    )
    current_version: int
    attach_path: str = Field(
        description="Where to attach with the pool token (POST, the per-run learner's attach)."
    )


class LeftRun(_Response):
    run_id: uuid.UUID
    reason: str = Field(description="Why it does not fit, e.g. needs 3.1 GB more, 1.2 GB left.")


class TakeResponse(_Response):
    runs: list[TakenRun] = Field(description="The runs this take assigned (may be empty).")
    held: list[uuid.UUID] = Field(
        description="Every run the pool learner holds now, these included."
    )
    hold_s: float = Field(
        description="How long a taken run stays held before its attach (then it is takeable)."
    )
    left: list[LeftRun] = Field(
        default_factory=list,
        description="Runs it could have taken but did not, as they do not fit its memory "
        "(takeable by another learner).",
    )
