"""The two gloo ranks of test_fleet_plan_fsdp.py (torch.multiprocessing, spawn): each builds
tiny bf16 Qwen2- and Llama-shaped models with an all-linear LoRA adapter, lets the learner's own
`DataParallel.shard` (FSDP2) shard them, and writes what this rank then holds: bytes of frozen
parameters (a sharded one counts its local shard), and the trainable (LoRA) parameters."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

RANK_LORA = 4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Every size even, so FSDP2's dim-0 shards split exactly in two.
SIZES = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 96,
    "max_position_embeddings": 64,
}


def configs() -> dict[str, Any]:
    """Hugging Face configs: Qwen2 (q/k/v biases, tied embeddings), Llama (untied head) and
    Qwen3 (a head_dim of its own, 32 ≠ 64 ÷ 4, and q/k norms)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    return {
        "qwen2": Qwen2Config(**SIZES, tie_word_embeddings=True),
        "llama": LlamaConfig(**SIZES, tie_word_embeddings=False),
        "qwen3": Qwen3Config(**SIZES, head_dim=32, tie_word_embeddings=False),
    }


def held(model: Any) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    frozen = trainable = 0
    dtypes = set()
    for p in model.parameters():
        if p.requires_grad:
            trainable += p.numel()
            dtypes.add(str(p.dtype))
        else:
            local = p.to_local() if isinstance(p, DTensor) else p
            frozen += local.numel() * local.element_size()
    return {"frozen_bytes": frozen, "trainable": trainable, "trainable_dtypes": sorted(dtypes)}


def rank_main(rank: int, world: int, port: int, out: str) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from learner.distributed import DataParallel, RankEnv

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dp = DataParallel(
        RankEnv(rank, world, rank), device="cpu", collective_timeout_s=60.0, fsdp=True
    )
    report: dict[str, Any] = {}
    for name, config in configs().items():
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16).eval()
        lora = LoraConfig(r=RANK_LORA, target_modules=TARGETS, task_type="CAUSAL_LM")
        model = get_peft_model(base, lora)
        whole = held(model)
        dp.shard(model)
        report[name] = {"config": config.to_dict(), "unsharded": whole, "sharded": held(model)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dp.close()
