"""Per-token log-probs of given completions: log_softmax(logits / T) of each completion token.

The layout matches batched `generate` (facts.md pitfalls 1-3, 5): prompts padded on the LEFT to
the longest prompt, completions after them padded on the right; the attention mask is 0 on every
pad and position ids count only real tokens, so each row sees exactly what the sampler saw.
Completion token t of a row sits at position P + t and is predicted by the logits at P + t - 1
(P = longest prompt). Only the T + 1 last positions' logits are computed (`logits_to_keep`),
which keeps the (B, T, V) tensor the only large one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch


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
    model: Any, batch: PackedBatch, temperature: float, *, with_entropy: Literal[False] = False
) -> torch.Tensor: ...


@overload
def packed_logprobs(
    model: Any, batch: PackedBatch, temperature: float, *, with_entropy: Literal[True]
) -> tuple[torch.Tensor, torch.Tensor]: ...


def packed_logprobs(
    model: Any, batch: PackedBatch, temperature: float, *, with_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs of the completion tokens (0 where completion_mask is False).

    Differentiable: call under torch.no_grad() when no gradient is wanted. With
    `with_entropy`, also the (B, T) entropy -sum_v p_v log p_v of the temperature-scaled
    distribution p = softmax(logits / T) at each completion position (0 on pads); it is a
    metric, computed without gradient.
    """
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    t_width = batch.completion_ids.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=t_width + 1,
    )
    logits = out.logits[:, :-1, :]  # (B, T, V): position P-1+t predicts completion token t
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, T, V)
    token = logprobs.gather(2, batch.completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    token = token.masked_fill(~batch.completion_mask, 0.0)
    if not with_entropy:
        return token
    with torch.no_grad():  # one (B, T, V) temporary, not two
        entropy = -logprobs.exp().mul_(logprobs).sum(-1)  # (B, T)
    return token, entropy.masked_fill(~batch.completion_mask, 0.0)


def completion_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    *,
    pad_id: int,
    batch_size: int = 8,
    use_adapter: bool = True,
) -> list[list[float]]:
    """Log-probs of each completion token under `model` (no gradient), in micro-batches.

    `model` may be a PEFT model; `use_adapter=False` scores with its adapter disabled.
    """
    result: list[list[float]] = []
    with torch.no_grad(), _adapter_state(model, use_adapter):
        for start in range(0, len(prompts), batch_size):
            batch = pack(
                prompts[start : start + batch_size], completions[start : start + batch_size], pad_id
            )
            token = packed_logprobs(model, batch, temperature)  # (b, T)
            for row, n in zip(token, batch.completion_mask.sum(-1).tolist(), strict=True):
                result.append(row[: int(n)].tolist())
    return result
