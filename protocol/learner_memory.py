"""A learner's memory (pure arithmetic, no I/O): the one home of the formulas the planner shows
(server/dashboard/fleet_plan.py) and of the rule a pool learner's take applies
(server/learners/service.py `take`, docs/guides/pool-learners.md, "Memory").

A model's shape comes from its Hugging Face config.json (`shape_from_hf_config`). A LoRA adapter
of rank r on a linear layer d_in → d_out adds r × (d_in + d_out) parameters. Memory of one
learner GPU (GB = 10^9 bytes), for P base parameters, Lp LoRA parameters, a micro-batch of T
tokens, a model of L layers, hidden h, KV width kv, MLP width i, vocabulary V:
- base weights, bf16: 2·P bytes. With FSDP over N GPUs what the learner shards
  (learner/distributed.py, `shard`: each decoder layer's frozen base weights, FSDP2) is divided:
  2·L·(parameters of one layer) / N, plus two unsharded layers in flight (the one computing and
  the one prefetched): 2 · 2 · (parameters of one layer); the rest stays whole on every GPU:
  2 · (embeddings, an untied LM head, the final norm).
- LoRA training state, fp32: 16·Lp (weights 4, gradients 4, Adam m and v 8), whole on every GPU
  with or without FSDP (the learner replicates the LoRA weights and all-reduces their
  gradients).
- activations kept for the backward pass, bf16, attention without the s² term (SDPA / flash):
  per token and layer 2 · (4h + 2q + 2kv + 4i) bytes (two norm inputs, the projections' input,
  q, k, v, the attention output, the MLP input, gate, up, activation and product; q = heads ×
  head_dim, which is h unless config.json sets its own head_dim). Without gradient
  checkpointing all L layers keep them; with it each layer keeps only its input (2h per token)
  and one layer's set is alive again while it is recomputed: 2·L·h + 2·(4h + 2q + 2kv + 4i).
- logits for the log-probabilities, fp32: 4·V per token.
Activations are per GPU (each rank runs its own micro-batch), so FSDP does not divide them.
An estimate: allocator fragmentation, CUDA context (~0.5-1 GB) and temporary buffers come on top.

A pool learner holding runs R1..Rn of one base model on one GPU (`pool_need`): the base weights
once (in the learner's dtype: `weight_bytes` per parameter), each run's own LoRA state (16 bytes
per LoRA parameter of its rank and target modules), the largest micro-batch's activations and
logits among them (it trains them in turn, one step at a time; activations in the learner's
dtype), and POOL_OVERHEAD_BYTES. A run fits (`pool_fit`) when that need with it is within the
budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from protocol.run_config import RunConfig

MB = 1e6
GB = 1e9
MAX_DIM = 10_000_000  # any config.json size (layers, widths, vocabulary) beyond is refused
BYTES_BASE = 2  # bf16 base weights (the planner's learner: --dtype bfloat16)
BYTES_LORA_STATE = 16  # fp32 weight, gradient, Adam m and v
BYTES_LOGIT = 4
# What a pool learner's process holds besides weights, LoRA state, activations and logits: the
# CUDA context, the allocator's fragmentation, temporary buffers (the planner leaves it out).
POOL_OVERHEAD_BYTES = 1_000_000_000
ALL_LINEAR = "all-linear"  # PEFT's shorthand for every linear module of a layer


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


TARGETS: dict[str, tuple[str, ...]] = {
    "qv": ("q_proj", "v_proj"),
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    ALL_LINEAR: ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}


def lora_parameters(shape: ModelShape, rank: int, modules: Sequence[str]) -> int:
    """LoRA parameters of rank `rank` on `modules` of every layer, named as a run config's
    lora.target_modules: a module's name or a dotted path ending in it (PEFT matches the end),
    or "all-linear". A name the shape does not know (another architecture's) counts as its
    widest module: an over-estimate rather than a run that does not fit."""
    dims = shape.module_dims()
    widest = max(dims.values(), key=sum)
    wrapped: dict[str, tuple[int, int]] = {}
    for name in modules:
        if name == ALL_LINEAR:
            wrapped.update(dims)
        else:
            last = name.rsplit(".", 1)[-1]
            wrapped[last] = dims.get(last, widest)
    return shape.layers * sum(rank * (d_in + d_out) for d_in, d_out in wrapped.values())


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


@dataclass(frozen=True)
class Memory:
    """GB per learner GPU."""

    weights: float
    lora_state: float
    activations: float
    logits: float
    total: float


def activation_bytes_per_token(
    shape: ModelShape, checkpointing: bool, element_bytes: int = BYTES_BASE
) -> int:
    """Bytes kept for the backward pass per token of a micro-batch (module docstring), each
    value `element_bytes` wide (the base weights' dtype)."""
    widths = 4 * shape.hidden + 2 * shape.q_dim + 2 * shape.kv_dim + 4 * shape.intermediate
    one_layer = element_bytes * widths
    if checkpointing:
        return element_bytes * shape.layers * shape.hidden + one_layer
    return shape.layers * one_layer


def learner_memory(
    shape: ModelShape,
    lora_params: int,
    micro_batch_tokens: int,
    *,
    gpus: int,
    fsdp: bool,
    checkpointing: bool,
) -> Memory:
    """GB on each of `gpus` learner GPUs (module docstring)."""
    shards = gpus if fsdp else 1
    layers = shape.layers * shape.layer_parameters()  # sharded by FSDP
    whole = shape.parameters() - layers  # embeddings, untied head, final norm: never sharded
    weights = BYTES_BASE * (layers / shards + whole)
    if fsdp:
        weights += 2 * BYTES_BASE * shape.layer_parameters()
    lora = BYTES_LORA_STATE * lora_params  # replicated on every rank, FSDP or not
    acts = micro_batch_tokens * activation_bytes_per_token(shape, checkpointing)
    logits = micro_batch_tokens * BYTES_LOGIT * shape.vocab
    return Memory(
        weights=weights / GB,
        lora_state=lora / GB,
        activations=acts / GB,
        logits=logits / GB,
        total=(weights + lora + acts + logits) / GB,
    )


# -- the pool rule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunNeed:
    """What a run asks of a pool learner's memory, from its config (`run_need`)."""

    rank: int
    target_modules: tuple[str, ...]
    micro_batch_tokens: int
    checkpointing: bool


def run_need(config: RunConfig) -> RunNeed:
    return RunNeed(
        rank=config.lora.rank,
        target_modules=tuple(config.lora.target_modules),
        micro_batch_tokens=config.grpo.micro_batch_tokens,
        checkpointing=config.grpo.gradient_checkpointing,
    )


def lora_state_bytes(shape: ModelShape, need: RunNeed) -> int:
    return BYTES_LORA_STATE * lora_parameters(shape, need.rank, need.target_modules)


def step_bytes(shape: ModelShape, need: RunNeed, weight_bytes: int = BYTES_BASE) -> int:
    """One micro-batch's activations (in the learner's dtype) and fp32 logits."""
    per_token = activation_bytes_per_token(shape, need.checkpointing, weight_bytes)
    return need.micro_batch_tokens * (per_token + BYTES_LOGIT * shape.vocab)


def pool_base_bytes(shape: ModelShape, weight_bytes: int = BYTES_BASE) -> int:
    """What a pool learner holds with no run: the base weights once and the overhead."""
    return weight_bytes * shape.parameters() + POOL_OVERHEAD_BYTES


def pool_need(shape: ModelShape, runs: Sequence[RunNeed], weight_bytes: int = BYTES_BASE) -> int:
    """Bytes a pool learner needs to hold `runs` at once (module docstring)."""
    lora = sum(lora_state_bytes(shape, need) for need in runs)
    step = max((step_bytes(shape, need, weight_bytes) for need in runs), default=0)
    return pool_base_bytes(shape, weight_bytes) + lora + step


class Fit(NamedTuple):
    fits: bool
    reason: str  # why not, readable; "" when it fits


def size(n_bytes: float) -> str:
    """Bytes as GB with one decimal, or as MB below 1 GB (a small model's LoRA state)."""
    return f"{n_bytes / GB:,.1f} GB" if n_bytes >= GB else f"{n_bytes / MB:,.0f} MB"


def pool_fit(
    shape: ModelShape,
    budget_bytes: float,
    held: Sequence[RunNeed],
    candidate: RunNeed,
    weight_bytes: int = BYTES_BASE,
) -> Fit:
    """Whether `candidate` fits beside the `held` runs in `budget_bytes`, and why not."""
    before = pool_need(shape, held, weight_bytes)
    after = pool_need(shape, [*held, candidate], weight_bytes)
    if after <= budget_bytes:
        return Fit(True, "")
    budget = size(budget_bytes)
    if before > budget_bytes and not held:
        return Fit(
            False,
            f"the base model's weights and the overhead alone need {size(before)}, over the "
            f"{budget} memory budget",
        )
    left = max(0.0, budget_bytes - before)
    runs = f" beside the {len(held)} run(s) it holds" if held else ""
    return Fit(
        False, f"needs {size(after - before)} more{runs}, {size(left)} left of the {budget} budget"
    )
