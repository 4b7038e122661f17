"""Worker settings: one pydantic-settings root, parsed before torch (or vLLM) is imported.

Every field can come from the command line (`asyncgrpo worker --...`) or from the environment
with the prefix `ASYNCGRPO_WORKER_` (e.g. `ASYNCGRPO_WORKER_SERVER_URL`).
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from protocol.capabilities import VLLM_LORA_RANKS, vllm_max_lora_rank_for
from protocol.rewards import MODULE_PATH
from protocol.settings_env import refuse_unknown_part_variables

# Each worker keeps its local state (token file, adapter cache, batch files) in a folder of its
# own name under this one, so two workers on one host do not share a token by default.
STATE_ROOT = Path.home() / ".cache" / "asyncgrpo" / "worker"


def state_folder_name(worker_name: str) -> str:
    """`worker_name` as one safe folder name (anything but letters, digits, `.`, `_` and `-`
    becomes `_`)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", worker_name)
    return "_" + safe if safe in ("", ".", "..") else safe


class VllmSettings(BaseSettings):
    """vLLM engine options (docs/guides/real-run.md, "Rollout workers", says how vLLM runs on
    CPU)."""

    model_config = SettingsConfigDict(env_prefix="ASYNCGRPO_WORKER_VLLM_", extra="forbid")

    max_model_len: int = Field(1024, gt=0, description="Longest prompt + completion in tokens.")
    max_lora_rank: int = Field(
        16,
        gt=0,
        description="Largest LoRA rank the engine accepts, one of vLLM's "
        f"({', '.join(map(str, VLLM_LORA_RANKS))}); declared to the server, which grants the "
        "worker only runs whose lora.rank is at most this (examples/runs/"
        "gsm8k-qwen2.5-1.5b.json trains rank 32).",
    )
    max_loras: int = Field(2, gt=0, description="Adapters resident in one batch.")
    max_cpu_loras: int = Field(4, gt=0, description="Adapters kept loaded (LRU) in CPU memory.")
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="Share of GPU memory vLLM may take (GPU only)."
    )
    enforce_eager: bool = Field(True, description="No CUDA graphs / compilation (faster start).")
    kv_cache_space_gb: int = Field(
        1, gt=0, description="VLLM_CPU_KVCACHE_SPACE in GiB (CPU build only)."
    )

    @field_validator("max_lora_rank")
    @classmethod
    def _a_rank_vllm_accepts(cls, rank: int) -> int:
        if rank not in (1, *VLLM_LORA_RANKS):
            fits = vllm_max_lora_rank_for(rank)
            ranks = ", ".join(map(str, VLLM_LORA_RANKS))
            raise ValueError(
                f"vLLM's engine accepts a max_lora_rank of 1 or {ranks}"
                + (f" (for rank {rank}: {fits})" if fits is not None else "")
            )
        return rank


class SimulatedSettings(BaseSettings):
    """The `simulated` backend's engine profile (worker/backends/simulated.py): benchmarks only.

    Defaults model a ~1.5B model under vLLM on one H100 (an assumption, stated in the module).
    """

    model_config = SettingsConfigDict(env_prefix="ASYNCGRPO_WORKER_SIMULATED_", extra="forbid")

    max_batch: int = Field(256, gt=0, description="Sequences decoded together in one step.")
    step_s: float = Field(
        0.025, ge=0, description="Seconds one decode step takes, whatever the batch occupancy."
    )
    prefill_s_per_token: float = Field(
        2e-5, ge=0, description="Seconds of prefill per prompt token, added to the joining step."
    )
    mean_completion_tokens: float = Field(
        256.0,
        gt=1,
        description="Mean completion length at temperature 1 (sets the EOS probability; "
        "max_new_tokens still cuts).",
    )
    vocab_tokens: int = Field(
        512, ge=2, description="Ordinary token ids the fixed distribution samples from."
    )
    adapter_load_gbps: float = Field(
        2.0, gt=0, description="GB/s at which an adapter's files load into the engine."
    )


class WorkerSettings(BaseSettings):
    """Everything the rollout worker needs; nothing here imports torch."""

    # populate_by_name: the aliases below are whole environment names (the prefix does not
    # apply to them), and code still passes server_url=… / num_threads=…
    model_config = SettingsConfigDict(
        env_prefix="ASYNCGRPO_WORKER_", extra="forbid", populate_by_name=True
    )

    # Also under the command-line option's name (--server, --threads): every option is also
    # ASYNCGRPO_WORKER_<OPTION>.
    server_url: str = Field(
        validation_alias=AliasChoices(
            "server_url", "ASYNCGRPO_WORKER_SERVER_URL", "ASYNCGRPO_WORKER_SERVER"
        ),
        description="Base URL of the control plane, e.g. http://host:8000 (--server; "
        "ASYNCGRPO_WORKER_SERVER_URL or ASYNCGRPO_WORKER_SERVER).",
    )
    registration_token: str | None = Field(
        None,
        description="agr_reg_… token used once to register; not needed when the token file "
        "already holds a worker token.",
    )
    name: str | None = Field(
        None,
        description="Worker name shown in the fleet; it names the worker's state folder.",
        json_schema_extra={"shown_default": "the host name"},
    )
    gpu_type: str = Field("cpu", description="GPU type, e.g. H100, A10G or cpu.")
    gpu_count: int = Field(1, ge=1, description="GPUs in this box.")
    price_per_hour: float = Field(0.0, ge=0, description="USD per hour this box costs.")
    backend: Literal["vllm", "transformers", "simulated"] = Field(
        "transformers",
        description="Generation backend: vllm (GPU, or vllm-cpu), transformers, or simulated "
        "(a timed stand-in for a GPU engine, for benchmarks of the control plane only).",
    )
    model: str = Field(
        "smollm2-135m-instruct",
        description="Base model served: an HF id, a local folder or the built-in alias.",
    )
    state_dir: Path | None = Field(
        None,
        description="Folder of this worker's local state, named after the worker (its name, "
        "else the host name); the token file, adapter cache and work dir default to it.",
        json_schema_extra={"shown_default": "~/.cache/asyncgrpo/worker/<name>"},
    )
    # None until _state_in_own_folder fills it from state_dir: a Path once validated
    token_file: Path = Field(
        None,  # type: ignore[assignment]
        validate_default=False,
        description="Where the worker token is kept (mode 0600) and reused on restart. One "
        "worker process at a time may use it (a lock refuses a second).",
        json_schema_extra={"shown_default": "<state_dir>/token.json"},
    )
    adapter_cache_dir: Path = Field(
        None,  # type: ignore[assignment]
        validate_default=False,
        description="Downloaded adapter versions.",
        json_schema_extra={"shown_default": "<state_dir>/adapters"},
    )
    adapter_cache_bytes: int = Field(
        2 * 1024**3, gt=0, description="Size bound of the adapter cache (LRU by (run, version))."
    )
    work_dir: Path = Field(
        None,  # type: ignore[assignment]
        validate_default=False,
        description="Where batch files are written before upload.",
        json_schema_extra={"shown_default": "<state_dir>/batches"},
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Weights dtype for generation. auto, resolved when the engine starts: "
        "bfloat16 on a GPU that supports it, float16 on an older GPU, float32 on the CPU (the "
        "GPU: vllm's when torch sees one, transformers' with --device cuda); the worker tells "
        "the server the dtype it resolved.",
    )
    device: str = Field("cpu", description="torch device for the transformers backend.")
    num_threads: int | None = Field(
        None,
        ge=1,
        validation_alias=AliasChoices(
            "num_threads", "ASYNCGRPO_WORKER_NUM_THREADS", "ASYNCGRPO_WORKER_THREADS"
        ),
        description="torch intra-op threads (None: all; --threads; ASYNCGRPO_WORKER_NUM_THREADS "
        "or ASYNCGRPO_WORKER_THREADS).",
    )
    max_batch_sequences: int = Field(
        64, ge=1, description="transformers: sequences generated in one forward batch."
    )
    max_loaded_adapters: int = Field(
        4, ge=1, description="transformers: PEFT adapters kept loaded (LRU)."
    )
    max_inflight_sequences: int | None = Field(
        None,
        ge=1,
        description="Keep acquiring leases while the sequences (prompts x G) of the leases held "
        "stay under this; all held leases generate at once on the one engine. Default: 256 "
        "for vllm, max_batch_sequences for transformers, the simulated engine's batch size for "
        "simulated. One lease's worth gives the old one-lease-at-a-time worker.",
    )
    acquire_wait_s: float = Field(
        10.0, ge=0, le=600, description="Long-poll time asked of acquire."
    )
    idle_backoff_min_s: float = Field(0.5, gt=0, description="First wait after an empty acquire.")
    idle_backoff_max_s: float = Field(30.0, gt=0, description="Longest wait between acquires.")
    retry_max_s: float = Field(
        30.0, gt=0, description="Longest wait between retries while the server or bucket is down."
    )
    http_timeout_s: float = Field(30.0, gt=0, description="Timeout of one HTTP call.")
    shutdown_grace_s: float = Field(
        3.0,
        gt=0,
        description="On SIGTERM, time allowed to stop generating and release the lease; the "
        "process exits within about this + 1.5 s.",
    )
    engine_fault_limit: int = Field(
        3,
        ge=1,
        description="The engine may die (vLLM's EngineDeadError, out of memory) this many times "
        "within engine_fault_window_s before the worker gives up and exits; each death releases "
        "the lease (reason engine_fault: an attempt counted) and restarts the engine.",
    )
    engine_fault_window_s: float = Field(
        600.0, gt=0, description="The window in which engine_fault_limit deaths end the worker."
    )
    max_leases: int | None = Field(
        None,
        ge=1,
        description="Take at most this many leases, then exit once they have all ended (tests, "
        "demos).",
    )
    environment_modules: list[str] = Field(
        default_factory=list,
        description="Modules whose Environment classes a run may name (`module:Class`); with "
        "the entry points of the group `asyncgrpo.environments` installed here, the only user "
        "environment code this worker loads. Built-ins are always allowed (a JSON list in "
        "ASYNCGRPO_WORKER_ENVIRONMENT_MODULES).",
    )
    tool_memory_mb: int = Field(
        512,
        ge=64,
        le=65536,
        description="Address-space limit (RLIMIT_AS) of each tool process, in MiB.",
    )
    vllm: VllmSettings = Field(default_factory=VllmSettings, description="vLLM engine options.")
    simulated: SimulatedSettings = Field(
        default_factory=SimulatedSettings, description="The simulated engine's profile."
    )

    @field_validator("environment_modules")
    @classmethod
    def _module_paths(cls, modules: list[str]) -> list[str]:
        for module in modules:
            if not MODULE_PATH.match(module):
                raise ValueError(f"{module!r} is not a dotted module path (e.g. my_envs.games)")
        return modules

    @model_validator(mode="after")
    def _state_in_own_folder(self) -> WorkerSettings:
        if self.state_dir is None:
            name = self.name or socket.gethostname()
            self.state_dir = STATE_ROOT / state_folder_name(name)
        for field, default in (
            ("token_file", "token.json"),
            ("adapter_cache_dir", "adapters"),
            ("work_dir", "batches"),
        ):
            if getattr(self, field) is None:
                setattr(self, field, self.state_dir / default)
        return self

    @model_validator(mode="after")
    def _check_backoff(self) -> WorkerSettings:
        if self.idle_backoff_min_s > self.idle_backoff_max_s:
            raise ValueError(
                "idle_backoff_min_s must not exceed idle_backoff_max_s "
                f"(got {self.idle_backoff_min_s} > {self.idle_backoff_max_s})"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_variables(cls, data: object) -> object:
        refuse_unknown_part_variables(cls, "a worker setting (worker/config.py)")
        return data
