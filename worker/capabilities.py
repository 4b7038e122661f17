"""What this worker's engine can load, as it declares it to the server (protocol/capabilities.py):
the largest LoRA rank (the vLLM engine's --vllm-max-lora-rank; the transformers and simulated
backends load any) and the dtype it generates in (`auto` resolved here: bfloat16 on a GPU that
supports it, float16 on an older GPU, float32 on the CPU). A lease whose adapter the engine
cannot load is refused here too (`lease_refusal`: the worker releases it `unservable`), for a
server that granted it without knowing (docs/architecture/lease-engine.md, "Workers that can
serve the run")."""

from __future__ import annotations

from protocol.capabilities import GenerationDtype, WorkerCapabilities, why_cannot_serve
from protocol.schemas import Lease
from worker.config import WorkerSettings


def auto_dtype(*, on_gpu: bool, bf16_supported: bool) -> GenerationDtype:
    """`--dtype auto`'s choice: bfloat16 on a GPU that supports it, float16 on an older GPU
    (before compute capability 8.0), float32 on the CPU."""
    if not on_gpu:
        return "float32"
    return "bfloat16" if bf16_supported else "float16"


def generation_dtype(settings: WorkerSettings) -> GenerationDtype:
    """The dtype the engine generates in: the one asked for, or `auto`'s choice for the device
    the engine runs on (vLLM's: a GPU when torch sees one; the transformers backend's:
    --device). The simulated backend computes nothing: float32."""
    if settings.dtype != "auto":
        return settings.dtype
    if settings.backend == "simulated":
        return "float32"
    try:
        import torch
    except ImportError:  # no torch, no GPU to use (`asyncgrpo doctor worker` says so)
        return "float32"
    wants_gpu = settings.backend == "vllm" or settings.device.startswith("cuda")
    on_gpu = wants_gpu and torch.cuda.is_available()
    return auto_dtype(on_gpu=on_gpu, bf16_supported=on_gpu and torch.cuda.is_bf16_supported())


def declared(settings: WorkerSettings, dtype: GenerationDtype | None = None) -> WorkerCapabilities:
    """The capabilities to declare; `dtype` once it is resolved (None at registration, before
    the engine starts: the first acquire declares it)."""
    rank = settings.vllm.max_lora_rank if settings.backend == "vllm" else None
    return WorkerCapabilities(max_lora_rank=rank, dtype=dtype)


def lease_refusal(lease: Lease, capabilities: WorkerCapabilities) -> str | None:
    """Why this worker's engine cannot load the lease's adapter, naming the setting to raise
    (None: it can, or the lease does not say: a server from before LoRA shapes)."""
    if lease.lora is None:
        return None
    why = why_cannot_serve(lease.lora, capabilities)
    return None if why is None else f"adapter: {why}"
