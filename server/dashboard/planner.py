"""LoRA payload and sync-time calculator (pure arithmetic, no I/O).

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

BYTES_BF16 = 2
BYTES_ADAM_STATE = 8  # m and v, fp32
MB = 1e6
GB = 1e9
MAX_LINK_GBPS = 1_000_000
MAX_DIM = 10_000_000  # any config.json size (layers, widths, vocabulary) beyond is refused


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
    # config.json's `head_dim` where it is not hidden ÷ heads (Qwen3, Gemma); None: hidden ÷ heads
    explicit_head_dim: int | None = None
    qk_norm: bool = False  # a norm over each head's q and k (Qwen3): 2 · head_dim per layer

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of q and of the attention output: heads × head_dim (= hidden unless the
        config sets a head_dim of its own)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def module_dims(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of each linear module of one layer."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_parameters(self) -> int:
        """One decoder layer: its linear modules, two norms, the q/k/v biases and the q/k norms
        if any."""
        per_layer = sum(a * b for a, b in self.module_dims().values()) + 2 * self.hidden
        if self.attention_bias:
            per_layer += self.q_dim + 2 * self.kv_dim
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        return per_layer

    def parameters(self) -> int:
        """All parameters: embeddings (and an untied head), layers, norms."""
        per_layer = self.layer_parameters()
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden


PRESETS: dict[str, ModelShape] = {
    "llama-2-7b": ModelShape("Llama-2-7B", 32, 4096, 11008, 32, 32, 32000, False, False),
    "qwen2.5-7b": ModelShape("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 152064, False, True),
    "qwen2.5-1.5b": ModelShape("Qwen2.5-1.5B", 28, 1536, 8960, 12, 2, 151936, True, True),
    # the small model (the `smollm2-135m-instruct` alias, docs/guides/sweeps.md)
    "smollm2-135m": ModelShape("SmolLM2-135M", 30, 576, 1536, 9, 3, 49152, True, False),
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


def shape_from_hf_config(config: dict[str, object], name: str) -> ModelShape:
    """A decoder-only model's shape from its Hugging Face config.json (Llama, Qwen2, Mistral
    and alike); ValueError naming the first missing or bad key."""

    def number(key: str, default: int | None = None) -> int:
        value = config.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
            raise ValueError(
                f"config.json: {key} must be a positive integer, at most {MAX_DIM:,} "
                f"(got {str(value)[:20]!r})"
            )
        return value

    heads = number("num_attention_heads")
    hidden = number("hidden_size")
    head_dim = number("head_dim") if config.get("head_dim") is not None else None
    if head_dim is None and hidden % heads:
        raise ValueError(
            f"config.json: num_attention_heads ({heads}) must divide hidden_size ({hidden}), "
            "or head_dim must be given"
        )
    kv_heads = number("num_key_value_heads", heads)
    if heads % kv_heads:
        raise ValueError(
            f"config.json: num_key_value_heads ({kv_heads}) must divide num_attention_heads "
            f"({heads})"
        )
    return ModelShape(
        name=name,
        layers=number("num_hidden_layers"),
        hidden=hidden,
        intermediate=number("intermediate_size"),
        heads=heads,
        kv_heads=kv_heads,
        vocab=number("vocab_size"),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        # Qwen2 puts a bias on q, k and v without saying so in its config.
        attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        explicit_head_dim=head_dim,
        qk_norm=config.get("model_type") == "qwen3",
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
