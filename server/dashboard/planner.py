"""LoRA payload and sync-time calculator (pure arithmetic, no I/O).

A LoRA adapter of rank r on a linear layer d_in → d_out adds r × (d_in + d_out) parameters
(A: r × d_in, B: d_out × r). The payload is those parameters in bf16 (2 bytes each). A full
fine-tune instead moves every weight (bf16) and keeps Adam's m and v in fp32 (8 bytes per
parameter). MB = 10^6 bytes, GB = 10^9 bytes; a link of L Gb/s moves L × 10^9 / 8 bytes a second.
"""

from __future__ import annotations

from dataclasses import dataclass

BYTES_BF16 = 2
BYTES_ADAM_STATE = 8  # m and v, fp32
MB = 1e6
GB = 1e9


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs of a decoder-only transformer."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool
    attention_bias: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def module_dims(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of each linear module of one layer."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def parameters(self) -> int:
        """All parameters: embeddings (and an untied head), layers, norms."""
        per_layer = sum(a * b for a, b in self.module_dims().values()) + 2 * self.hidden
        if self.attention_bias:
            per_layer += self.hidden + 2 * self.kv_dim
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden


PRESETS: dict[str, ModelShape] = {
    "llama-2-7b": ModelShape("Llama-2-7B", 32, 4096, 11008, 32, 32, 32000, False, False),
    "qwen2.5-7b": ModelShape("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 152064, False, True),
    "qwen2.5-1.5b": ModelShape("Qwen2.5-1.5B", 28, 1536, 8960, 12, 2, 151936, True, True),
}

TARGETS: dict[str, tuple[str, ...]] = {
    "qv": ("q_proj", "v_proj"),
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "all-linear": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
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


def lora_parameters(shape: ModelShape, rank: int, modules: tuple[str, ...]) -> int:
    dims = shape.module_dims()
    return shape.layers * sum(rank * (dims[m][0] + dims[m][1]) for m in modules)


def transfer_seconds(n_bytes: float, link_gbps: float) -> float:
    return n_bytes * 8 / (link_gbps * 1e9)


def plan(preset: str, rank: int, targets: str, link_gbps: float) -> Plan:
    """Adapter size and sync time against the full fine-tune; ValueError on a bad input."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}")
    if targets not in TARGETS:
        raise ValueError(f"unknown target set {targets!r}")
    if not 1 <= rank <= 4096:
        raise ValueError(f"rank must be between 1 and 4096 (got {rank})")
    if not link_gbps > 0:
        raise ValueError(f"link speed must be greater than 0 Gb/s (got {link_gbps})")
    shape = PRESETS[preset]
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
