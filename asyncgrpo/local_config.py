"""Settings of `asyncgrpo local` (docs/guides/local.md), parsed before torch is imported, and
the run config file it reads. Every field is an option (asyncgrpo/settings_options.py) and an
environment variable `ASYNCGRPO_LOCAL_<OPTION>`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from asyncgrpo.settings_options import describe
from protocol.settings_env import refuse_unknown_part_variables


class GpuMemorySplit(BaseSettings):
    """How the vLLM workers and the learner share the GPU's memory (CUDA only; unused on CPU).
    The two shares add up to at most 1; what is left over is the CUDA contexts' and the
    transformers workers' (which take no share)."""

    model_config = SettingsConfigDict(env_prefix="ASYNCGRPO_LOCAL_GPU_MEMORY_", extra="forbid")

    vllm: float = Field(
        0.45,
        gt=0,
        lt=1,
        description="Share of the GPU's memory for the vLLM workers together: each worker's "
        "gpu_memory_utilization is this divided by --workers.",
    )
    learner: float = Field(
        0.45,
        gt=0,
        lt=1,
        description="Share of the GPU's memory the learner's torch allocator may take (the "
        "learner's --gpu-memory-fraction); past it the learner's step fails out of memory.",
    )

    @model_validator(mode="after")
    def _fits(self) -> GpuMemorySplit:
        total = self.vllm + self.learner
        if total > 1 + 1e-9:
            raise ValueError(
                f"the vLLM workers' share ({self.vllm:g}) and the learner's ({self.learner:g}) "
                f"add up to {total:g}, more than the whole GPU (1)"
            )
        return self


class LocalSettings(BaseSettings):
    """Everything `asyncgrpo local` needs; nothing here imports torch."""

    model_config = SettingsConfigDict(env_prefix="ASYNCGRPO_LOCAL_", extra="forbid")

    run_file: Path = Field(
        description="The run config, a JSON file as POST /api/v1/runs takes it (e.g. "
        "examples/runs/arithmetic.json).",
        json_schema_extra={"argument": True},
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the learner and the workers compute: cuda (the first GPU, shared by "
        "the memory split), cpu, or auto (cuda when torch sees a GPU, else cpu).",
    )
    workers: int = Field(1, ge=1, le=64, description="Rollout worker processes to start.")
    backend: Literal["auto", "vllm", "transformers"] = Field(
        "auto",
        description="The workers' generation backend: auto (vllm on CUDA when the workers' "
        "Python can import it, else transformers), vllm or transformers.",
    )
    worker_python: Path | None = Field(
        None,
        description="The Python that runs the workers, e.g. a virtual environment with vLLM's "
        "CUDA build (docs/guides/local.md); the server and the learner run in this one.",
        json_schema_extra={"shown_default": "this Python"},
    )
    model: str | None = Field(
        None,
        description="Replaces the run config's base_model (an HF id, a local folder or the "
        "alias smollm2-135m-instruct); the learner and the workers load the same.",
        json_schema_extra={"shown_default": "the run's base_model"},
    )
    max_versions: int | None = Field(
        None,
        ge=1,
        description="Replaces the run config's max_versions: the run completes after this many "
        "adapter versions (a short trial).",
        json_schema_extra={"shown_default": "the run's max_versions"},
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Weights dtype of the learner's base model and the workers' (auto: "
        "bfloat16 on CUDA, float32 on CPU).",
    )
    threads: int = Field(
        1, ge=1, description="torch CPU threads of each process (the learner and each worker)."
    )
    port: int | None = Field(None, ge=1, le=65535, description="Server port (default: a free one).")
    dir: Path = Field(
        Path("asyncgrpo-local"),
        description="Work dir: the database, the bucket, the logs, the workers' and the "
        "learner's state.",
    )
    gpu_memory: GpuMemorySplit = Field(
        default_factory=GpuMemorySplit, description="The GPU memory split (CUDA only)."
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_variables(cls, data: object) -> object:
        refuse_unknown_part_variables(
            cls, "a setting of asyncgrpo local (asyncgrpo/local_config.py)"
        )
        return data


class RunFileError(ValueError):
    """The run config file cannot be read or is not a valid run config (one line)."""


def _absolute(value: str, base: Path) -> str:
    return value if Path(value).is_absolute() else str(base / value)


def server_paths(config: dict[str, Any], base: Path) -> dict[str, Any]:
    """`config` with the relative local paths of its `hf` datasets made absolute against
    `base`: `data_files` always, `path` when it names something there (else it is a Hub id). The
    embedded server runs in the work dir, where a relative path would no longer point."""
    blocks = [config.get("dataset"), (config.get("eval") or {}).get("dataset")]
    for block in blocks:
        if not isinstance(block, dict) or block.get("kind") != "hf":
            continue
        files = block.get("data_files")
        if isinstance(files, str):
            block["data_files"] = _absolute(files, base)
        elif isinstance(files, list):
            block["data_files"] = [_absolute(f, base) if isinstance(f, str) else f for f in files]
        path = block.get("path")
        if isinstance(path, str) and (base / path).exists():
            block["path"] = _absolute(path, base)
    return config


def load_run_file(path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The run config in `path` with `overrides` (top-level fields) applied and its datasets'
    relative paths taken from the current directory (`server_paths`), checked by the run config
    model; RunFileError names the file and each refused field."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise RunFileError(f"{path}: a run config is a JSON object, not {type(raw).__name__}")
    from protocol.run_config import RunConfig  # not at import: every command imports this

    try:
        RunConfig.model_validate({**raw, **overrides})  # the file as written, first
    except ValidationError as exc:
        raise RunFileError(f"{path}: {describe(exc)}") from None
    return server_paths({**raw, **overrides}, Path.cwd())
