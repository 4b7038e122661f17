"""lm.logprobs against the sampler: log-probs recomputed by a forward pass equal those of
transformers `generate` (raw output_logits / T, top_k=0, top_p=1) on left-padded batches."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lm.chat import encode_prompt
from lm.logprobs import completion_logprobs, pack

TEMPERATURE = 0.7


def test_pack_layout() -> None:
    batch = pack([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], pad_id=0)
    assert batch.prompt_width == 3
    assert batch.input_ids.tolist() == [[5, 6, 7, 1, 2, 0], [0, 0, 8, 3, 4, 9]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]]
    assert batch.completion_ids.tolist() == [[1, 2, 0], [3, 4, 9]]
    assert batch.completion_mask.tolist() == [[True, True, False], [True, True, True]]


def _sample(model: Any, tokenizer: Any, prompts: list[list[int]], n: int, max_new: int):
    """Sample with generate on a left-padded batch; return completions (through the first EOS)
    and the sampler's log-probs log_softmax(raw logits / T)."""
    eos = tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts])  # (B, P)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # (B, P)
    torch.manual_seed(0)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new,
        num_return_sequences=n,
        pad_token_id=eos,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[:, width:]  # (B*n, S)
    logits = torch.stack(out.logits, dim=1).float()  # (B*n, S, V)
    lp = torch.log_softmax(logits / TEMPERATURE, dim=-1).gather(2, new[..., None]).squeeze(2)
    completions, behaviour = [], []
    for row, row_lp in zip(new.tolist(), lp, strict=True):
        end = row.index(eos) + 1 if eos in row else len(row)  # EOS belongs to the completion
        completions.append(row[:end])
        behaviour.append(row_lp[:end].tolist())
    return completions, behaviour


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_matches_generate_on_left_padded_batches(small_model: Any, small_tokenizer: Any) -> None:
    torch.set_num_threads(1)
    questions = [
        "What is 7+5?",
        "Name a colour.",
        "Write one long sentence about the sea and ships.",
    ]
    prompts = [encode_prompt(small_tokenizer, q, "Be brief.") for q in questions]
    assert len({len(p) for p in prompts}) > 1  # really left-padded
    n = 2
    completions, behaviour = _sample(small_model, small_tokenizer, prompts, n=n, max_new=12)
    repeated = [p for p in prompts for _ in range(n)]
    recomputed = completion_logprobs(
        small_model,
        repeated,
        completions,
        TEMPERATURE,
        pad_id=small_tokenizer.eos_token_id,
        batch_size=4,
    )
    flat_a = torch.tensor([x for row in behaviour for x in row])
    flat_b = torch.tensor([x for row in recomputed for x in row])
    assert [len(r) for r in recomputed] == [len(c) for c in completions]
    delta = (flat_a - flat_b).abs()
    assert delta.mean().item() < 1e-4, delta.mean().item()
    assert delta.max().item() < 1e-3, delta.max().item()
    assert (flat_b <= 0).all()
