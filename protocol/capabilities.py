"""What a worker's engine can load, as the worker declares it, and the one rule of which runs
it can serve by that (docs/architecture/lease-engine.md, "Workers that can serve the run"): a
run whose LoRA adapter its engine cannot load is never granted to it, and a run that no live
worker can serve says why (`no_worker_can_serve`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from protocol.config_base import MAX_LORA_RANK

if TYPE_CHECKING:
    from protocol.run_config import LoraConfig

# What a leasing run says when no live worker can serve it (server/runs/serving.py).
NO_WORKER_CAN_SERVE = "no_worker_can_serve"
MAX_DECLARED_MODULES = 64
ModuleName = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.]+$", description="A module name."),
]
GenerationDtype = Literal["float32", "bfloat16", "float16"]


class WorkerCapabilities(BaseModel):
    """What a worker declares with its registration and with each acquire (replacing what it
    declared before); a worker that never declared any is taken to serve every run."""

    model_config = ConfigDict(extra="forbid")

    max_lora_rank: int | None = Field(
        None,
        ge=1,
        le=MAX_LORA_RANK,
        description="The largest LoRA rank its engine loads (vLLM's --vllm-max-lora-rank); "
        "null: any (the transformers backend).",
    )
    lora_target_modules: list[ModuleName] | None = Field(
        None,
        max_length=MAX_DECLARED_MODULES,
        description="The modules its engine can apply a LoRA adapter to; null: any.",
    )
    dtype: GenerationDtype | None = Field(
        None, description="The dtype its engine generates in (shown in the fleet); null: unknown."
    )


def why_cannot_serve(lora: LoraConfig, capabilities: WorkerCapabilities | None) -> str | None:
    """Why a worker with these capabilities cannot load a run's adapter, with the setting that
    would let it; None: it can."""
    if capabilities is None:
        return None
    largest = capabilities.max_lora_rank
    if largest is not None and lora.rank > largest:
        return (
            f"lora.rank {lora.rank} is above the worker's largest LoRA rank {largest}: start it "
            f"with --vllm-max-lora-rank {lora.rank} (ASYNCGRPO_WORKER_VLLM_MAX_LORA_RANK)"
        )
    modules = capabilities.lora_target_modules
    if modules is not None:
        missing = sorted(set(lora.target_modules) - set(modules))
        if missing:
            return (
                f"lora.target_modules {missing} are not among the modules the worker's engine "
                f"applies LoRA to ({sorted(modules)})"
            )
    return None
