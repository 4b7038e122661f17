"""`asyncgrpo local RUN.json`: a user's run on this machine (docs/guides/local.md). The embedded
server, the learner and N rollout workers share this machine's device: on CUDA the learner
takes its share of the GPU's memory and the vLLM workers theirs (asyncgrpo/local_config.py,
GpuMemorySplit); on CPU the split is not used. asyncgrpo/live_run.py runs and watches it, as it
does the demo."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncgrpo.cluster import ClusterConfig
from asyncgrpo.live_run import QUICK_STOP_WORKER_ENV, LivePlan
from asyncgrpo.local_config import LocalSettings
from protocol.capabilities import VLLM_LORA_RANKS, vllm_max_lora_rank_for
from protocol.run_config import RunConfig

FIND_VLLM = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"


class LocalError(ValueError):
    """This machine cannot run what was asked (no GPU, no vLLM…): one line for the CLI."""


@dataclass(frozen=True)
class Placement:
    """Where the processes compute: the device, the workers' backend, the weights' dtype and
    the GPU's name (the workers' gpu_type)."""

    device: str  # "cpu" or "cuda"
    backend: str  # "vllm" or "transformers"
    dtype: str
    gpu_type: str


def cuda_gpu_name() -> str | None:
    """The first CUDA device's name, as this Python's torch sees it (None: no GPU, or no
    torch)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name(0))[:100]  # the workers' gpu_type: 100 at most


def vllm_importable(python: str) -> bool:
    """Whether `python` can import vllm (found, not imported: that takes a while)."""
    try:
        found = subprocess.run([python, "-c", FIND_VLLM], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0


def place(settings: LocalSettings, gpu_name: Callable[[], str | None] = cuda_gpu_name) -> Placement:
    """Resolve `auto` in the device, backend and dtype (`gpu_name`: this machine's GPU, asked
    only when the device may be CUDA); LocalError when this machine lacks what was asked for."""
    gpu = gpu_name() if settings.device != "cpu" else None
    if settings.device == "cuda" and gpu is None:
        raise LocalError("--device cuda: this Python's torch sees no CUDA device")
    device = "cuda" if gpu is not None else "cpu"
    python = str(settings.worker_python or sys.executable)
    backend = settings.backend
    if backend == "auto":
        backend = "vllm" if device == "cuda" and vllm_importable(python) else "transformers"
    elif backend == "vllm" and not vllm_importable(python):
        raise LocalError(f"--backend vllm: {python} cannot import vllm (see --worker-python)")
    dtype = settings.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    return Placement(device, backend, dtype, gpu or "cpu")


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds an adapter of `rank`."""
    fits = vllm_max_lora_rank_for(rank)
    if fits is None:
        raise LocalError(
            f"lora.rank {rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})"
        )
    return fits


def worker_env(settings: LocalSettings, placement: Placement, run: RunConfig) -> dict[str, str]:
    """The workers' settings (ASYNCGRPO_WORKER_*): backend, device, dtype and, for vLLM, the
    engine's LoRA rank and, on CUDA, each worker's part of the vLLM share."""
    env = {
        **QUICK_STOP_WORKER_ENV,
        "ASYNCGRPO_WORKER_BACKEND": placement.backend,
        "ASYNCGRPO_WORKER_DEVICE": placement.device,
        "ASYNCGRPO_WORKER_DTYPE": placement.dtype,
        "ASYNCGRPO_WORKER_GPU_TYPE": placement.gpu_type,
    }
    if placement.backend == "vllm":
        env["ASYNCGRPO_WORKER_VLLM_MAX_LORA_RANK"] = str(vllm_lora_rank(run.lora.rank))
        if placement.device == "cuda":
            share = settings.gpu_memory.vllm / settings.workers
            env["ASYNCGRPO_WORKER_VLLM_GPU_MEMORY_UTILIZATION"] = f"{share:.4f}"
    return env


def learner_env(settings: LocalSettings, placement: Placement) -> dict[str, str]:
    """The learner's settings (ASYNCGRPO_LEARNER_*): device, dtype and, on CUDA, its share."""
    env = {
        "ASYNCGRPO_LEARNER_DEVICE": placement.device,
        "ASYNCGRPO_LEARNER_DTYPE": placement.dtype,
    }
    if placement.device == "cuda":
        env["ASYNCGRPO_LEARNER_GPU_MEMORY_FRACTION"] = f"{settings.gpu_memory.learner:.4f}"
    return env


def local_plan(
    settings: LocalSettings, run_config: dict[str, Any], placement: Placement
) -> LivePlan:
    """The whole run: the run config as given (overrides applied) and its processes."""
    run = RunConfig.model_validate(run_config)
    where = f"{placement.device}, {placement.backend}, {placement.dtype}"
    if placement.device == "cuda":
        where += (
            f"; GPU memory: vLLM {settings.gpu_memory.vllm:g}, "
            f"learner {settings.gpu_memory.learner:g}"
        )
    cluster = ClusterConfig(
        work_dir=Path(settings.dir),
        port=settings.port,
        worker_env=worker_env(settings, placement, run),
        learner_env=learner_env(settings, placement),
        model=run.base_model,  # the learner's --model must be the run's
        threads=settings.threads,
        worker_python=str(settings.worker_python) if settings.worker_python else None,
    )
    return LivePlan(
        title="asyncgrpo local",
        run_config=run_config,
        cluster=cluster,
        workers=settings.workers,
        worker_prefix="local-worker",
        where=where,
        staged=True,  # one engine start at a time on a shared device, the learner last
    )


def prepare(settings: LocalSettings, run_config: dict[str, Any]) -> LivePlan:
    """The plan for `run_config` on this machine; LocalError when the machine cannot run it."""
    return local_plan(settings, run_config, place(settings))
