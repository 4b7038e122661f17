"""Log-probs through the LM head in chunks of positions (lm/logprobs.py): the same values,
entropies and gradients as the whole (B, T, V) path, on the real small model with a LoRA
adapter, and the whole path for a model whose head is not a plain linear map."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from lm.logprobs import _decoder_and_head, pack, packed_logprobs

pytestmark = pytest.mark.timeout(300)

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9]]
COMPLETIONS = [[11, 12, 13, 14, 15, 16, 17], [21, 22]]  # 7 and 2 tokens: the chunks split rows


def with_lora(model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)  # fmt: skip
    return get_peft_model(model, config)


@pytest.fixture(scope="module")
def lora_model(small_model: Any) -> Any:
    return with_lora(copy.deepcopy(small_model))


def scored(model: Any, chunk: int | None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    batch = pack(PROMPTS, COMPLETIONS, pad_id=0)
    token, entropy = packed_logprobs(model, batch, 0.7, with_entropy=True, chunk_positions=chunk)
    (token.sum() * 0.5).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    return token.detach(), entropy, grads


def test_chunked_equals_whole_values_and_entropies(lora_model: Any) -> None:
    assert _decoder_and_head(lora_model) is not None  # the chunked path is the one taken
    whole_token, whole_entropy, _ = scored(lora_model, None)
    token, entropy, _ = scored(lora_model, 3)
    # fp32: the LM head's matmul blocks differently by chunk; 1e-5 relative to the value
    assert torch.allclose(token, whole_token, atol=1e-5, rtol=1e-5)
    assert torch.allclose(entropy, whole_entropy, atol=1e-5, rtol=1e-5)
    assert whole_token[1, 2:].eq(0).all() and token[1, 2:].eq(0).all()  # pads stay 0


def test_chunked_gradients_equal_the_whole_paths(small_model: Any) -> None:
    # In float64, where a different reduction order cannot hide a real difference (in fp32 the
    # two paths' LoRA gradients differ by ~1e-4 of their largest element: rounding alone).
    model = with_lora(copy.deepcopy(small_model).double())
    _, _, whole = scored(model, None)
    _, _, chunked = scored(model, 3)
    assert len(chunked) == len(whole) > 0
    for got, want in zip(chunked, whole, strict=True):
        assert torch.allclose(got, want, atol=1e-10, rtol=1e-9)


def test_a_head_that_is_not_linear_takes_the_whole_path(small_model: Any) -> None:
    shaped = copy.copy(small_model)
    shaped.config = copy.copy(small_model.config)
    shaped.config.final_logit_softcapping = 30.0
    assert _decoder_and_head(shaped) is None
    assert _decoder_and_head(small_model) is not None
