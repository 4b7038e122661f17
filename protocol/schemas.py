"""Wire models shared by server, worker and learner (pydantic; no torch, no web stack).

Request models forbid unknown fields (the server answers 422 for them).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from protocol.capabilities import LoraShape, WorkerCapabilities

SHA256_PATTERN = r"^[0-9a-f]{64}$"
# Column ranges the database can store (BIGINT, INTEGER): larger numbers are 422, not a 500.
BIGINT_MAX = 2**63 - 1
INT_MAX = 2**31 - 1

# A run's states (docs/architecture/run-lifecycle.md, "Run lifecycle"; server/runs/lifecycle.py
# moves them).
RunStatus = Literal[
    "preparing",
    "pending",
    "running",
    "paused",
    "budget_exhausted",
    "evaluating",
    "completed",
    "failed",
    "cancelled",
]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
# A run in one of these never changes status again.
TERMINAL_RUN_STATUSES = frozenset({"completed", "failed", "cancelled"})
# A run in one of these hands out leases (training while running, eval leases while evaluating)
# and keeps its eval leases alive.
LEASING_RUN_STATUSES: tuple[str, ...] = ("running", "evaluating")


# Free-form JSON (metrics, reward kwargs, reference columns) is stored as JSON/JSONB and
# re-encoded on every read: deeper nesting broke the encoder (500s for good), NaN/Infinity and
# U+0000 are refused by Postgres jsonb. Every such field is checked at the edge by free_json().
MAX_JSON_DEPTH = 32
KIB = 1024


class JsonTooLarge(ValueError):
    """A value over check_free_json's byte bound."""


def check_free_json(value: Any, max_bytes: int) -> Any:
    """Raise ValueError (the path and the reason) unless `value` nests at most MAX_JSON_DEPTH
    levels, holds only finite numbers and strings without NUL or unpaired surrogates (neither
    can be stored or encoded as UTF-8), and is about max_bytes or less as JSON. Walks
    iteratively: a hostile depth cannot exhaust the stack here."""
    size = 0
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels{_at(path)}")
        if isinstance(item, dict):
            for key, child in item.items():
                _check_text(str(key), path)
                size += len(str(key)) + 4
                stack.append((child, depth + 1, f"{path}.{key}" if path else str(key)))
        elif isinstance(item, list | tuple):
            stack.extend((c, depth + 1, f"{path}[{i}]") for i, c in enumerate(item))
            size += len(item) + 2
        elif isinstance(item, str):
            size += _check_text(item, path) + 2
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"numbers must be finite, not {item!r}{_at(path)}")
        else:
            size += 8
        if size > max_bytes:
            raise JsonTooLarge(f"larger than {max_bytes:,} bytes as JSON")
    return value


def _at(path: str) -> str:
    if len(path) > 200:
        path = path[:200] + "…"
    return f" (at {path})" if path else ""


def _check_text(text: str, path: str) -> int:
    """The text's size in UTF-8 bytes; ValueError for a NUL or an unpaired surrogate."""
    if "\x00" in text:
        raise ValueError(f"text may not contain NUL (\\u0000){_at(path)}")
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(
            f"text may not contain an unpaired surrogate (\\ud800-\\udfff){_at(path)}"
        ) from None


def free_json(max_bytes: int) -> Callable[[Any], Any]:
    """An AfterValidator body bounding one free-form JSON field (see check_free_json)."""

    def check(value: Any) -> Any:
        try:
            return check_free_json(value, max_bytes)
        except ValueError as exc:
            raise PydanticCustomError("json_bounds", str(exc)) from None

    return check


# A base model name as a run's base_model allows it (RunConfig: 1 to 500 characters).
MAX_MODEL_NAME = 500
MAX_WORKER_MODELS = 16
ModelName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_MODEL_NAME, description="A base model (HF id or alias)."),
]


MAX_DECLARED_ENVIRONMENTS = 64
# What a worker can run, as EnvironmentAllowlist.names() writes it: a built-in, an entry-point
# name or `module:*` (protocol/environments.py).
EnvironmentName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=300,
        pattern=r"^[A-Za-z0-9_.\-]+(:[A-Za-z_*][A-Za-z0-9_]*)?$",
        description="An environment the worker can run: a built-in, an entry-point name or "
        "'module:*' (any class of an allowed module).",
    ),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- worker calls (lease engine) ---------------------------------------------------------------


class LeaseAcquireRequest(_Request):
    """Ask for a lease; the server answers 204 when nothing is admissible."""

    models: list[ModelName] | None = Field(
        None,
        max_length=MAX_WORKER_MODELS,
        description="Base models to lease for now; must be among the worker's registered models "
        "(409 naming both otherwise). None: all of them.",
    )
    wait_s: float = Field(
        0.0,
        ge=0,
        le=600,
        description="Long-poll: wait up to this many seconds (capped by the server) for work.",
    )
    environments: list[EnvironmentName] | None = Field(
        None,
        max_length=MAX_DECLARED_ENVIRONMENTS,
        description="The environments this worker can run now (replacing what it declared "
        "before); None: what it declared at registration (a worker that never declared any: "
        "single_turn).",
    )
    capabilities: WorkerCapabilities | None = Field(
        None,
        description="What its engine can load now (replacing what it declared before); None: "
        "what it declared last (a worker that never declared any serves every run).",
    )


class ChatMessage(BaseModel):
    role: str = Field(description="system, user or assistant.")
    content: str = Field(description="Message text.")


class LeasePrompt(BaseModel):
    """One prompt of a lease. Reference columns never leave the server for workers."""

    prompt_row_id: int = Field(description="Id of the prompt row (dataset row in one epoch).")
    dataset_row_id: int = Field(description="Id of the dataset row.")
    prompt: str | list[ChatMessage] = Field(description="Prompt text or chat messages.")
    epoch: int = Field(description="Epoch of this prompt row.")


class AdapterFile(BaseModel):
    name: str = Field(description="File name, e.g. adapter_model.safetensors.")
    url: str = Field(description="Short-lived download URL.")
    sha256: str = Field(description="Hex sha256 the download must match.")
    size: int | None = Field(None, description="Bytes, when known.")


class AdapterRef(BaseModel):
    """The adapter version to generate with (absent for version 0, the base model)."""

    version: int = Field(description="Adapter version.")
    sha256: str = Field(description="sha256 recorded for the version.")
    files: list[AdapterFile] = Field(description="PEFT files with download URLs.")


# A training lease's batch is trained on; an eval lease's batch (pinned to the version under
# evaluation, no behaviour log-probs) is only scored (docs/guides/evaluation.md).
LeaseKind = Literal["train", "eval"]
TRAIN_KIND: LeaseKind = "train"  # the kind's one spelling (server/leases/train.py TrainKind)


class Lease(BaseModel):
    """Everything a worker needs to produce one batch."""

    lease_id: uuid.UUID = Field(description="Lease id.")
    kind: LeaseKind = Field(
        "train",
        description="train, or eval: generate with exactly adapter_version (never a newer "
        "one), at sampling.temperature (0: greedy), without behaviour log-probs.",
    )
    run_id: uuid.UUID = Field(description="Run id.")
    base_model: str = Field(description="Base model of the run.")
    tokenizer_fingerprint: str | None = Field(description="Tokenizer fingerprint of the run.")
    sampling: dict[str, Any] = Field(description="Sampling parameters (RunConfig.sampling).")
    max_new_tokens: int = Field(description="Completion length limit in tokens.")
    system_prompt: str | None = Field(None, description="System message for string prompts.")
    group_size: int = Field(description="Completions per prompt (G).")
    prompts: list[LeasePrompt] = Field(description="Prompts to generate for.")
    seed: int = Field(description="Seed for this lease's sampling.")
    adapter_version: int = Field(description="Adapter version to use (0: the base model).")
    adapter: AdapterRef | None = Field(None, description="Adapter download; None for version 0.")
    fencing: int = Field(description="Fencing token: send it with every call on this lease.")
    ttl_s: float = Field(description="The lease expires this long after the last heartbeat.")
    heartbeat_interval_s: float = Field(description="Heartbeat at least this often.")
    batch_key: str = Field(description="The one bucket key this lease's batch goes to.")
    environment: dict[str, Any] | None = Field(
        None,
        description="The run's environment (RunConfig.environment as JSON); None: single_turn.",
    )
    lora: LoraShape | None = Field(
        None,
        description="The run's LoRA rank and target modules: a worker whose engine cannot load "
        "such an adapter releases the lease `unservable` (protocol/capabilities.py); None: a "
        "server from before it.",
    )


# Every acquire answer (200 and 204) carries the current version of each running run of the
# worker's base models: "<run_id>=<version>,<run_id>=<version>" (empty when there is none).
VERSIONS_HEADER = "X-Asyncgrpo-Versions"


def format_versions_header(versions: Mapping[uuid.UUID, int]) -> str:
    return ",".join(f"{run_id}={version}" for run_id, version in versions.items())


def parse_versions_header(value: str | None) -> dict[uuid.UUID, int]:
    """The header's versions by run ({} when absent or empty); ValueError when malformed."""
    versions: dict[uuid.UUID, int] = {}
    for pair in (value or "").split(","):
        if pair.strip():
            run_id, _, version = pair.strip().partition("=")
            versions[uuid.UUID(run_id)] = int(version)
    return versions


# GET /api/v1/versions: at most this many `after` entries, each "<run_id>:<version>".
MAX_VERSIONS_AFTER = 256


def format_after(run_id: uuid.UUID, version: int) -> str:
    return f"{run_id}:{version}"


class VersionNotice(BaseModel):
    """A run whose current version is newer than the one the worker named."""

    run_id: uuid.UUID = Field(description="A running run of one of the worker's base models.")
    version: int = Field(description="The run's current adapter version.")
    adapter: AdapterRef | None = Field(
        description="The version's adapter download, as a lease of it carries; None for version 0."
    )


class VersionsResponse(BaseModel):
    """What GET /api/v1/versions answers when some run is newer than `after` says."""

    versions: list[VersionNotice] = Field(description="Every such run, one entry each.")


class FencedRequest(_Request):
    fencing: int = Field(ge=0, le=BIGINT_MAX, description="The lease's fencing token.")


class HeartbeatRequest(FencedRequest):
    """Keep the lease alive."""


class HeartbeatResponse(BaseModel):
    current_version: int = Field(description="The run's current adapter version.")
    abort: bool = Field(description="True: the lease was aborted; drop the work.")
    ttl_s: float = Field(description="The lease now expires this long from now.")
    reason: str | None = Field(None, description="Why the lease was aborted.")


MAX_HEARTBEATS = 512  # leases in one batch heartbeat


class LeaseBeat(_Request):
    """One lease of a batch heartbeat."""

    lease_id: uuid.UUID = Field(description="A lease this worker holds.")
    fencing: int = Field(ge=0, le=BIGINT_MAX, description="The lease's fencing token.")


class HeartbeatsRequest(_Request):
    """Heartbeats of several held leases in one call; each is answered on its own."""

    leases: list[LeaseBeat] = Field(
        min_length=1, max_length=MAX_HEARTBEATS, description="The leases to keep alive."
    )

    @field_validator("leases")
    @classmethod
    def _unique(cls, leases: list[LeaseBeat]) -> list[LeaseBeat]:
        seen: set[uuid.UUID] = set()
        for beat in leases:
            if beat.lease_id in seen:
                raise ValueError(f"lease {beat.lease_id} is listed twice")
            seen.add(beat.lease_id)
        return leases


class LeaseBeatAnswer(BaseModel):
    """What one lease's heartbeat answered: 200 with the heartbeat, or 404 (not a lease of this
    worker) or 409 (its fencing token, state or expiry no longer holds) with the detail and
    the error code."""

    lease_id: uuid.UUID = Field(description="The lease.")
    status: int = Field(description="200, 404 or 409, as the single heartbeat would answer.")
    heartbeat: HeartbeatResponse | None = Field(None, description="The answer when 200.")
    detail: str | None = Field(None, description="Why not, when 404 or 409 (for people).")
    code: str | None = Field(
        None,
        description="Why not, when 404 or 409 (for programs): `lease_not_found` or "
        "`fencing_lost` (protocol/error_codes.py).",
    )


class HeartbeatsResponse(BaseModel):
    results: list[LeaseBeatAnswer] = Field(description="One answer per lease, in request order.")


class UploadRequest(FencedRequest):
    size: int = Field(gt=0, le=BIGINT_MAX, description="Exact byte size of the batch file.")
    sha256: str = Field(pattern=SHA256_PATTERN, description="Hex sha256 of the batch file.")


class UploadResponse(BaseModel):
    """A presigned PUT: send the body with exactly these headers."""

    key: str = Field(description="The bucket key.")
    url: str = Field(description="Presigned PUT URL.")
    headers: dict[str, str] = Field(description="Headers the PUT must carry.")
    expires_in_s: int = Field(description="Seconds the URL stays valid.")


class BatchManifest(_Request):
    key: str = Field(max_length=1000, description="Bucket key the batch was uploaded to.")
    sha256: str = Field(pattern=SHA256_PATTERN, description="Hex sha256 of the batch file.")
    size: int = Field(gt=0, le=BIGINT_MAX, description="Byte size of the batch file.")
    n_samples: int = Field(ge=0, le=INT_MAX, description="Completions in the batch (prompts × G).")
    n_tokens: int = Field(ge=0, le=INT_MAX, description="Completion tokens in the batch.")
    generation_seconds: float = Field(
        ge=0, le=1e9, allow_inf_nan=False, description="Wall time spent generating."
    )


class CompleteRequest(FencedRequest):
    manifest: BatchManifest = Field(description="What was uploaded.")


class CompleteResponse(BaseModel):
    batch_id: uuid.UUID = Field(description="The rollout batch id.")
    state: Literal["accepted", "rejected"] = Field(description="Outcome.")
    reject_reason: str | None = Field(None, description="Why it was rejected.")


# Why a worker gives a lease back. Only an engine fault counts an attempt on the prompts (a
# prompt that kills engines every time is dropped after max_attempts); the others are the
# worker's own business (docs/architecture/lease-engine.md, "The queue").
ReleaseReason = Literal[
    "shutdown",
    "unservable",
    "adapter_invalid",
    "engine_fault",
    "prompt_too_long",
    "environment_error",
]
ATTEMPT_COUNTING_RELEASES = frozenset({"engine_fault", "prompt_too_long", "environment_error"})


class ReleaseRequest(FencedRequest):
    """Give the prompts back now (e.g. a spot preemption notice)."""

    reason: ReleaseReason | None = Field(
        None,
        description="Why: shutdown (preemption), unservable (model, tokenizer, environment or LoRA "
        "adapter not served here), adapter_invalid, engine_fault (the engine died generating "
        "it: counts an attempt on its prompts) or prompt_too_long (a prompt leaves no room "
        "for a model turn within environment.max_total_tokens: counts an attempt on the rows "
        "in prompt_row_ids, or on all its prompts when none are named) or environment_error "
        "(the run's environment failed rolling it out: counts an attempt on its prompts). "
        "Omitted: a plain release.",
    )
    prompt_row_ids: list[Annotated[int, Field(ge=0, le=BIGINT_MAX)]] | None = Field(
        None,
        max_length=10_000,
        description="With prompt_too_long: the lease's prompt rows that did not fit (only they "
        "count an attempt; the others go back unpunished).",
    )


class ReleaseResponse(BaseModel):
    released: int = Field(description="Prompt rows put back at the front of the queue.")


# -- learner calls -----------------------------------------------------------------------------
