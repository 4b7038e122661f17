"""What a worker's engine can load, as the worker declares it, and the one rule of which runs
it can serve by that (docs/architecture/lease-engine.md, "Workers that can serve the run";
invariant 27): a run whose LoRA adapter its engine cannot load is never granted to it, a worker
handed such a lease anyway releases it `unservable`, and a run that no live worker can serve
says why (`no_worker_can_serve`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from protocol.config_base import MAX_LORA_RANK

# What a leasing run says when no live worker can serve it (server/runs/serving.py; its
# symptom: server/dashboard/symptoms.py NO_WORKER_CAN_SERVE).
NO_WORKER_CAN_SERVE = "no_worker_can_serve"
MAX_DECLARED_MODULES = 64
ModuleName = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.]+$", description="A module name."),
]
GenerationDtype = Literal["float32", "bfloat16", "float16"]
# The LoRA ranks vLLM's engine accepts as max_lora_rank (vllm/config/lora.py, MaxLoRARanks;
# 1 left out: no run trains it).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
# The worker option that sets the vLLM engine's largest rank (worker/config.py VllmSettings).
MAX_RANK_OPTION = "--vllm-max-lora-rank"


def vllm_max_lora_rank_for(rank: int) -> int | None:
    """The smallest max_lora_rank vLLM accepts that holds an adapter of `rank` (None: above
    vLLM's largest)."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


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


def stored_capabilities(stored: dict[str, Any] | None) -> WorkerCapabilities | None:
    """A worker row's stored capabilities (None: never declared); keys this version does not
    know (a newer server's, before a downgrade) are left out rather than refused."""
    if stored is None:
        return None
    known = WorkerCapabilities.model_fields
    return WorkerCapabilities.model_validate({k: v for k, v in stored.items() if k in known})


class LoraShape(BaseModel):
    """What of a run's LoRA adapter decides whether an engine can load it (RunConfig.lora's
    rank and target modules), as a lease carries it."""

    rank: int = Field(description="lora.rank of the run.")
    target_modules: list[str] = Field(description="lora.target_modules of the run.")


class AdapterShape(Protocol):
    """RunConfig.lora (protocol/run_config.py LoraConfig) or a lease's LoraShape."""

    @property
    def rank(self) -> int: ...

    @property
    def target_modules(self) -> Sequence[str]: ...


def raise_rank_to(rank: int) -> str:
    """The setting that lets a vLLM worker load an adapter of `rank`."""
    fits = vllm_max_lora_rank_for(rank)
    if fits is None:
        return f"vLLM loads at most rank {VLLM_LORA_RANKS[-1]}: train a smaller lora.rank"
    return f"start the worker with {MAX_RANK_OPTION} {fits} (ASYNCGRPO_WORKER_VLLM_MAX_LORA_RANK)"


def missing_modules(lora: AdapterShape, capabilities: WorkerCapabilities) -> list[str]:
    """The run's target modules the engine cannot apply LoRA to ([] when it takes any)."""
    modules = capabilities.lora_target_modules
    return [] if modules is None else sorted(set(lora.target_modules) - set(modules))


def why_cannot_serve(lora: AdapterShape, capabilities: WorkerCapabilities | None) -> str | None:
    """The rule: why a worker with these capabilities cannot load a run's adapter, with the
    setting that would let it; None: it can (a worker that declared nothing can)."""
    if capabilities is None:
        return None
    largest = capabilities.max_lora_rank
    if largest is not None and lora.rank > largest:
        return (
            f"lora.rank {lora.rank} is above the engine's largest LoRA rank {largest}: "
            f"{raise_rank_to(lora.rank)}"
        )
    missing = missing_modules(lora, capabilities)
    if missing:
        return (
            f"lora.target_modules {missing} are not among the modules the engine applies LoRA "
            f"to ({sorted(capabilities.lora_target_modules or ())})"
        )
    return None


def why_none_can_serve(
    lora: AdapterShape, declared: Sequence[WorkerCapabilities | None]
) -> str | None:
    """Why none of these workers (each by what it declared) can load a run's adapter, the
    rule's refusals summed up over them with the setting to raise; None when one can, or when
    there are none."""
    if not declared or any(why_cannot_serve(lora, c) is None for c in declared):
        return None
    known = [c for c in declared if c is not None]
    too_small = [c.max_lora_rank for c in known if c.max_lora_rank is not None]
    too_small = [r for r in too_small if lora.rank > r]
    parts = []
    if too_small:
        parts.append(
            f"lora.rank {lora.rank} > largest max_lora_rank {max(too_small)} among "
            f"{_workers(len(too_small))}; {raise_rank_to(lora.rank)}"
        )
    lacking = [c for c in known if missing_modules(lora, c)]
    if lacking:
        missing = sorted({m for c in lacking for m in missing_modules(lora, c)})
        parts.append(
            f"lora.target_modules {missing} not among the modules {_workers(len(lacking))} "
            "apply LoRA to (start a worker whose engine can, or train other target_modules)"
        )
    return "; ".join(parts)


def _workers(n: int) -> str:
    return f"{n} live worker" + ("" if n == 1 else "s")
