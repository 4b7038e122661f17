"""What the worker declares its engine can load (worker/capabilities.py): the vLLM engine's
largest LoRA rank, none for the transformers backend, and `--dtype auto` resolved for the
device (float32 on this CPU machine; a GPU's choice by whether it supports bfloat16)."""

from __future__ import annotations

import pytest

from worker import capabilities
from worker.config import WorkerSettings

pytestmark = pytest.mark.unit


def settings(**values: object) -> WorkerSettings:
    return WorkerSettings(server_url="http://server", **values)  # type: ignore[arg-type]


def test_auto_is_the_default_and_float32_on_the_cpu() -> None:
    default = settings()
    assert default.dtype == "auto"
    assert capabilities.generation_dtype(default) == "float32"
    assert capabilities.generation_dtype(settings(backend="vllm")) == "float32"


def test_an_asked_dtype_is_kept() -> None:
    assert capabilities.generation_dtype(settings(dtype="bfloat16")) == "bfloat16"


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bfloat16"), (False, "float16")])
def test_auto_on_a_gpu_is_bfloat16_where_supported(
    monkeypatch: pytest.MonkeyPatch, bf16: bool, expected: str
) -> None:
    """The GPU is what this test is not about: torch's answers are set, not a device."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    assert capabilities.generation_dtype(settings(backend="vllm")) == expected
    assert capabilities.generation_dtype(settings(device="cuda:0")) == expected
    # the transformers backend on the CPU stays float32 on a GPU box
    assert capabilities.generation_dtype(settings(device="cpu")) == "float32"


def test_the_vllm_engine_declares_its_largest_rank_and_transformers_none() -> None:
    vllm = settings(backend="vllm", vllm={"max_lora_rank": 32})
    declared = capabilities.declared(vllm, "bfloat16")
    assert declared.max_lora_rank == 32 and declared.dtype == "bfloat16"
    assert capabilities.declared(settings()).max_lora_rank is None


def test_an_unknown_dtype_is_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match="dtype"):
        settings(dtype="int4")  # type: ignore[arg-type]
