"""What this worker's engine can load, as it declares it to the server (protocol/capabilities.py):
the largest LoRA rank (the vLLM engine's --vllm-max-lora-rank; the transformers backend loads
any) and the dtype it generates in (`auto` resolved here: bfloat16 on a GPU that supports it,
float16 on an older GPU, float32 on the CPU)."""

from __future__ import annotations

from protocol.capabilities import GenerationDtype, WorkerCapabilities
from worker.config import WorkerSettings


def generation_dtype(settings: WorkerSettings) -> GenerationDtype:
    """The dtype the engine generates in: the one asked for, or `auto`'s choice for the device
    (vLLM's: a GPU when torch sees one; the transformers backend's: --device)."""
    if settings.dtype != "auto":
        return settings.dtype
    if settings.backend == "simulated":
        return "float32"
    import torch

    on_gpu = torch.cuda.is_available() and (
        settings.backend == "vllm" or settings.device.startswith("cuda")
    )
    if not on_gpu:
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def declared(settings: WorkerSettings, dtype: GenerationDtype | None = None) -> WorkerCapabilities:
    """The capabilities to declare; `dtype` once the engine runs (None before it loads, at
    registration)."""
    rank = settings.vllm.max_lora_rank if settings.backend == "vllm" else None
    return WorkerCapabilities(max_lora_rank=rank, dtype=dtype)
