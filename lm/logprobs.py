"""Per-token log-probs of given completions: log_softmax(logits / T) of each completion token.

The layout matches batched `generate` (docs/architecture/loss.md, "Sampling"): prompts padded on
the LEFT to the longest prompt, completions after them padded on the right; the attention mask is
0 on every pad and position ids count only real tokens, so each row sees exactly what the sampler
saw. Completion token t of a row sits at position P + t and is predicted by the logits at P + t - 1
(P = longest prompt). For a plain causal LM (a decoder and a linear LM head, PEFT-wrapped or
not) the decoder runs once and the completion positions go through the LM head in chunks of
`chunk_positions`: the (B, T, V) logits never exist at once, and with a gradient each chunk is
recomputed in the backward pass (activation checkpointing), so only (B, chunk, V) is ever held.
Other models (a head that scales or soft-caps its logits) take the whole path: only the T + 1
last positions' logits (`logits_to_keep`), one (B, T, V) tensor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from torch.utils.checkpoint import checkpoint

CHUNK_POSITIONS = 64  # completion positions through the LM head at once


@dataclass
class PackedBatch:
    """Left-padded prompts followed by right-padded completions."""

    input_ids: torch.Tensor  # (B, P + T) long
    attention_mask: torch.Tensor  # (B, P + T) long, 0 on pads
    position_ids: torch.Tensor  # (B, P + T) long, counts real tokens only
    completion_ids: torch.Tensor  # (B, T) long, pad_id after each completion
    completion_mask: torch.Tensor  # (B, T) bool, True on real completion tokens (EOS included)
    prompt_width: int  # P


def pack(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
) -> PackedBatch:
    """Build the generate-style layout for B (prompt, completion) pairs."""
    if len(prompts) != len(completions) or not prompts:
        raise ValueError("need the same positive number of prompts and completions")
    p_width = max(len(p) for p in prompts)
    t_width = max(max(len(c) for c in completions), 1)
    b = len(prompts)
    input_ids = torch.full((b, p_width + t_width), pad_id, dtype=torch.long)  # (B, P+T)
    attention_mask = torch.zeros((b, p_width + t_width), dtype=torch.long)  # (B, P+T)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        start = p_width - len(p)
        input_ids[i, start:p_width] = torch.tensor(list(p), dtype=torch.long)
        input_ids[i, p_width : p_width + len(c)] = torch.tensor(list(c), dtype=torch.long)
        attention_mask[i, start : p_width + len(c)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, P+T)
    completion_mask = attention_mask[:, p_width:].bool()  # (B, T)
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        completion_ids=input_ids[:, p_width:].clone(),
        completion_mask=completion_mask,
        prompt_width=p_width,
    )


@contextlib.contextmanager
def _adapter_state(model: Any, use_adapter: bool) -> Iterator[None]:
    """Run with the PEFT adapter disabled when asked (the reference policy = base model)."""
    if use_adapter or not hasattr(model, "disable_adapter"):
        yield
        return
    with model.disable_adapter():
        yield


@overload
def packed_logprobs(
    model: Any,
    batch: PackedBatch,
    temperature: float,
    *,
    with_entropy: Literal[False] = False,
    chunk_positions: int | None = CHUNK_POSITIONS,
) -> torch.Tensor: ...


@overload
def packed_logprobs(
    model: Any,
    batch: PackedBatch,
    temperature: float,
    *,
    with_entropy: Literal[True],
    chunk_positions: int | None = CHUNK_POSITIONS,
) -> tuple[torch.Tensor, torch.Tensor]: ...


def packed_logprobs(
    model: Any,
    batch: PackedBatch,
    temperature: float,
    *,
    with_entropy: bool = False,
    chunk_positions: int | None = CHUNK_POSITIONS,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs of the completion tokens (0 where completion_mask is False).

    Differentiable: call under torch.no_grad() when no gradient is wanted. With
    `with_entropy`, also the (B, T) entropy -sum_v p_v log p_v of the temperature-scaled
    distribution p = softmax(logits / T) at each completion position (0 on pads); it is a
    metric, computed without gradient. `chunk_positions=None` takes the whole path.
    """
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    parts = _decoder_and_head(model) if chunk_positions else None
    if parts is None:
        token, entropy = _whole(model, batch, temperature, with_entropy)
    else:
        assert chunk_positions is not None
        token, entropy = _chunked(*parts, batch, temperature, with_entropy, chunk_positions)
    token = token.masked_fill(~batch.completion_mask, 0.0)
    if not with_entropy:
        return token
    assert entropy is not None
    return token, entropy.masked_fill(~batch.completion_mask, 0.0)


def _decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """The decoder and the linear LM head of a plain causal LM (PEFT-wrapped or not: the
    adapter's layers live inside the decoder), or None when the head does more than a linear
    map of the last hidden state."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = getattr(base, "model", None), getattr(base, "lm_head", None)
    config = getattr(base, "config", None)
    if decoder is None or not isinstance(head, torch.nn.Linear):
        return None
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    return decoder, head


def _scored(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-probs (and entropy, without gradient) from (B, n, V) logits."""
    # at least fp32 (bf16/fp16 logits are upcast), never below the model's own precision
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logprobs = torch.log_softmax(wide / temperature, dim=-1)  # (B, n, V)
    token = logprobs.gather(2, ids.unsqueeze(-1)).squeeze(-1)  # (B, n)
    if not with_entropy:
        return token, None
    with torch.no_grad():  # one (B, n, V) temporary, not two
        entropy = -logprobs.exp().mul_(logprobs).sum(-1)  # (B, n)
    return token, entropy


def _whole(
    model: Any, batch: PackedBatch, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    t_width = batch.completion_ids.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=t_width + 1,
    )
    logits = out.logits[:, :-1, :]  # (B, T, V): position P-1+t predicts completion token t
    return _scored(logits, batch.completion_ids, temperature, with_entropy)


def _chunked(
    decoder: Any,
    head: torch.nn.Linear,
    batch: PackedBatch,
    temperature: float,
    with_entropy: bool,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    t_width, p = batch.completion_ids.shape[1], batch.prompt_width
    out = decoder(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    hidden = out.last_hidden_state[:, p - 1 : p - 1 + t_width]  # (B, T, H)

    def piece(h: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        token, entropy = _scored(head(h), ids, temperature, with_entropy)
        return (token,) if entropy is None else (token, entropy)

    tokens, entropies = [], []
    for start in range(0, t_width, chunk):
        h = hidden[:, start : start + chunk]  # (B, c, H)
        ids = batch.completion_ids[:, start : start + chunk]  # (B, c)
        if torch.is_grad_enabled() and h.requires_grad:
            scored = checkpoint(piece, h, ids, use_reentrant=False)
        else:
            scored = piece(h, ids)
        tokens.append(scored[0])
        entropies.extend(scored[1:])
    entropy = torch.cat(entropies, dim=1) if with_entropy else None
    return torch.cat(tokens, dim=1), entropy


def completion_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    *,
    pad_id: int,
    batch_size: int = 8,
    use_adapter: bool = True,
    masks: Sequence[Sequence[int]] | None = None,
) -> list[list[float]]:
    """Log-probs of each completion token under `model` (no gradient), in micro-batches.

    `model` may be a PEFT model; `use_adapter=False` scores with its adapter disabled. With
    `masks` (one per completion, aligned with its tokens), a completion is a trajectory's
    tokens after its prompt, scored in one pass, and only the positions where its mask is 1
    (the model's tokens) are returned.
    """
    result: list[list[float]] = []
    with torch.no_grad(), _adapter_state(model, use_adapter):
        for start in range(0, len(prompts), batch_size):
            batch = pack(
                prompts[start : start + batch_size], completions[start : start + batch_size], pad_id
            )
            token = packed_logprobs(model, batch, temperature)  # (b, T)
            for k, (row, n) in enumerate(
                zip(token, batch.completion_mask.sum(-1).tolist(), strict=True)
            ):
                values = row[: int(n)].tolist()
                if masks is not None:
                    mask = masks[start + k]
                    values = [v for v, m in zip(values, mask, strict=True) if m]
                result.append(values)
    return result
