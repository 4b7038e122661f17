"""LoRA payload and sync-time calculator (pure arithmetic; `load_shape` reads a local
config.json). A model's shape, its LoRA parameters and the learner's memory are
protocol/learner_memory.py's, which the pool learners' take uses too.

A LoRA adapter of rank r on a linear layer d_in → d_out adds r × (d_in + d_out) parameters
(A: r × d_in, B: d_out × r). The payload is those parameters in bf16 (2 bytes each). A full
fine-tune instead moves every weight (bf16) and keeps Adam's m and v in fp32 (8 bytes per
parameter). MB = 10^6 bytes, GB = 10^9 bytes; a link of L Gb/s moves L × 10^9 / 8 bytes a second.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from protocol.learner_memory import (
    GB,
    MB,
    TARGETS,
    ModelShape,
    lora_parameters,
    shape_from_hf_config,
)

BYTES_BF16 = 2
BYTES_ADAM_STATE = 8  # m and v, fp32
MAX_LINK_GBPS = 1_000_000


PRESETS: dict[str, ModelShape] = {
    "llama-2-7b": ModelShape("Llama-2-7B", 32, 4096, 11008, 32, 32, 32000, False, False),
    "qwen2.5-7b": ModelShape("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 152064, False, True),
    "qwen2.5-1.5b": ModelShape("Qwen2.5-1.5B", 28, 1536, 8960, 12, 2, 151936, True, True),
    # the small model (the `smollm2-135m-instruct` alias, docs/guides/sweeps.md)
    "smollm2-135m": ModelShape("SmolLM2-135M", 30, 576, 1536, 9, 3, 49152, True, False),
}

TARGET_LABELS = {
    "qv": "q, v only",
    "attention": "all attention (q, k, v, o)",
    "all-linear": "all linear (attention + MLP)",
}


@dataclass(frozen=True)
class Plan:
    """The calculator's answer for one model, rank, target set and link speed."""

    model: str
    rank: int
    targets: str
    link_gbps: float
    lora_params: int
    adapter_mb: float
    sync_seconds: float
    full_params: int
    full_weights_gb: float
    adam_state_gb: float
    full_sync_seconds: float
    ratio: float  # full weights bytes / adapter bytes


def transfer_seconds(n_bytes: float, link_gbps: float) -> float:
    return n_bytes * 8 / (link_gbps * 1e9)


def plan(preset: str, rank: int, targets: str, link_gbps: float) -> Plan:
    """Adapter size and sync time of a preset against the full fine-tune; ValueError on a bad
    input (the dashboard: presets only, never a path on the server)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}")
    return plan_shape(PRESETS[preset], rank, targets, link_gbps)


def plan_shape(shape: ModelShape, rank: int, targets: str, link_gbps: float) -> Plan:
    """Adapter size and sync time against the full fine-tune; ValueError on a bad input."""
    if targets not in TARGETS:
        raise ValueError(f"unknown target set {targets!r}")
    if not 1 <= rank <= 4096:
        raise ValueError(f"rank must be between 1 and 4096 (got {str(rank)[:20]})")
    if not (math.isfinite(link_gbps) and 0 < link_gbps <= MAX_LINK_GBPS):
        raise ValueError(
            f"link speed must be greater than 0 Gb/s, at most {MAX_LINK_GBPS:,} (got {link_gbps})"
        )
    lora = lora_parameters(shape, rank, TARGETS[targets])
    adapter_bytes = lora * BYTES_BF16
    full = shape.parameters()
    full_bytes = full * BYTES_BF16
    return Plan(
        model=shape.name,
        rank=rank,
        targets=targets,
        link_gbps=link_gbps,
        lora_params=lora,
        adapter_mb=adapter_bytes / MB,
        sync_seconds=transfer_seconds(adapter_bytes, link_gbps),
        full_params=full,
        full_weights_gb=full_bytes / GB,
        adam_state_gb=full * BYTES_ADAM_STATE / GB,
        full_sync_seconds=transfer_seconds(full_bytes, link_gbps),
        ratio=full_bytes / adapter_bytes,
    )


def load_shape(model: str) -> ModelShape:
    """A preset name, or a local config.json (or a folder holding one); ValueError otherwise."""
    if model in PRESETS:
        return PRESETS[model]
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"unknown model {model!r}: name a preset ({', '.join(PRESETS)}) or a local "
            "config.json (or its folder)"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return shape_from_hf_config(config, path.parent.name or str(path))
