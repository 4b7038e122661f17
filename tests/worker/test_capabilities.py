"""What the worker declares its engine can load (worker/capabilities.py): the vLLM engine's
largest LoRA rank, none for the transformers backend, `--dtype auto` resolved for the device,
and a lease whose adapter the engine cannot load refused with the setting to raise."""

from __future__ import annotations

import uuid

import pytest

from protocol.capabilities import LoraShape, WorkerCapabilities
from protocol.schemas import Lease
from worker import capabilities
from worker.config import VllmSettings, WorkerSettings

pytestmark = pytest.mark.unit


def settings(**values: object) -> WorkerSettings:
    return WorkerSettings(server_url="http://server", **values)  # type: ignore[arg-type]


def test_auto_is_the_default_and_float32_on_the_cpu() -> None:
    import torch

    assert not torch.cuda.is_available()  # this machine: the CPU's answer, on the CPU
    default = settings()
    assert default.dtype == "auto"
    assert capabilities.generation_dtype(default) == "float32"
    assert capabilities.generation_dtype(settings(backend="vllm")) == "float32"
    assert capabilities.generation_dtype(settings(device="cuda")) == "float32"  # no GPU here
    assert capabilities.generation_dtype(settings(backend="simulated")) == "float32"


def test_an_asked_dtype_is_kept() -> None:
    for dtype in ("float32", "bfloat16", "float16"):
        assert capabilities.generation_dtype(settings(dtype=dtype)) == dtype


def test_autos_choice_by_device() -> None:
    """A GPU that supports bfloat16 (compute capability 8.0 and up) gets it, an older one
    float16, the CPU float32 (a GPU box's check: bench/gpu_check.py and the device run of
    this change)."""
    assert capabilities.auto_dtype(on_gpu=True, bf16_supported=True) == "bfloat16"
    assert capabilities.auto_dtype(on_gpu=True, bf16_supported=False) == "float16"
    assert capabilities.auto_dtype(on_gpu=False, bf16_supported=True) == "float32"
    assert capabilities.auto_dtype(on_gpu=False, bf16_supported=False) == "float32"


def test_the_vllm_engine_declares_its_largest_rank_and_transformers_none() -> None:
    vllm = settings(backend="vllm", vllm={"max_lora_rank": 32})
    declared = capabilities.declared(vllm, "bfloat16")
    assert declared.max_lora_rank == 32 and declared.dtype == "bfloat16"
    assert declared.lora_target_modules is None
    assert capabilities.declared(settings()).max_lora_rank is None
    assert capabilities.declared(settings(backend="simulated")).max_lora_rank is None


def test_bad_settings_are_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match="dtype"):
        settings(dtype="int4")
    with pytest.raises(ValueError, match=r"max_lora_rank[\s\S]*for rank 24: 32"):
        VllmSettings(max_lora_rank=24)
    with pytest.raises(ValueError, match="max_lora_rank"):
        VllmSettings(max_lora_rank=0)
    assert VllmSettings(max_lora_rank=64).max_lora_rank == 64


def _lease(lora: LoraShape | None) -> Lease:
    return Lease(
        lease_id=uuid.uuid4(),
        run_id=uuid.uuid4(),
        base_model="m",
        tokenizer_fingerprint=None,
        sampling={"temperature": 1.0, "max_new_tokens": 8},
        max_new_tokens=8,
        group_size=2,
        prompts=[],
        seed=1,
        adapter_version=0,
        fencing=1,
        ttl_s=30.0,
        heartbeat_interval_s=5.0,
        batch_key="k",
        lora=lora,
    )


def test_a_lease_the_engine_cannot_load_is_refused_naming_the_setting() -> None:
    engine = WorkerCapabilities(max_lora_rank=16)
    refusal = capabilities.lease_refusal(_lease(LoraShape(rank=32, target_modules=["q"])), engine)
    assert refusal is not None
    assert "lora.rank 32" in refusal and "--vllm-max-lora-rank 32" in refusal
    assert (
        capabilities.lease_refusal(_lease(LoraShape(rank=16, target_modules=["q"])), engine) is None
    )
    assert capabilities.lease_refusal(_lease(None), engine) is None  # a server from before it
    narrow = WorkerCapabilities(lora_target_modules=["q_proj"])
    wide = LoraShape(rank=8, target_modules=["q_proj", "v_proj"])
    assert "['v_proj']" in (capabilities.lease_refusal(_lease(wide), narrow) or "")
    above_vllm = capabilities.lease_refusal(
        _lease(LoraShape(rank=1024, target_modules=["q"])), engine
    )
    assert above_vllm is not None and "train a smaller lora.rank" in above_vllm


def test_stored_capabilities_leave_out_keys_this_version_does_not_know() -> None:
    from protocol.capabilities import stored_capabilities

    assert stored_capabilities(None) is None
    stored = stored_capabilities({"max_lora_rank": 32, "dtype": "bfloat16", "vram_gib": 80})
    assert stored == WorkerCapabilities(max_lora_rank=32, dtype="bfloat16")
