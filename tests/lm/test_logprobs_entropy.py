"""Per-token entropy of the temperature-scaled distribution, the optional output of
lm.logprobs.packed_logprobs, against values computed by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lm.logprobs import pack, packed_logprobs


class FixedLogits(torch.nn.Module):
    """Every position gets the same logits over a 2-token vocabulary."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = torch.tensor(logits)

    def forward(self, *, input_ids: torch.Tensor, logits_to_keep: int, **_: Any) -> Any:
        b = input_ids.shape[0]
        return SimpleNamespace(logits=self.logits.expand(b, logits_to_keep, 2).clone())


def test_entropy_of_the_temperature_scaled_distribution() -> None:
    # logits (0, 2 ln 3) at T = 2 -> softmax of (0, ln 3) -> p = (1/4, 3/4)
    model = FixedLogits([0.0, 2 * math.log(3.0)])
    batch = pack([[1], [1, 0]], [[1, 0, 1], [0]], pad_id=0)  # second row: 1 token, 2 pads
    token, entropy = packed_logprobs(model, batch, 2.0, with_entropy=True)
    by_hand = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # = ln 4 - (3/4) ln 3
    assert by_hand == pytest.approx(0.5623351446, abs=1e-9)
    expected = torch.tensor([[by_hand] * 3, [by_hand, 0.0, 0.0]])
    assert torch.allclose(entropy, expected, atol=1e-6)
    # the log-probs are the same as without entropy: ln(3/4) for token 1, ln(1/4) for 0
    assert torch.equal(token, packed_logprobs(model, batch, 2.0))
    assert token[0].tolist() == pytest.approx([math.log(0.75), math.log(0.25), math.log(0.75)])
    # at T = 1 the distribution is sharper: p = (1/10, 9/10)
    _, sharp = packed_logprobs(model, batch, 1.0, with_entropy=True)
    assert sharp[0, 0].item() == pytest.approx(-(0.1 * math.log(0.1) + 0.9 * math.log(0.9)))


def test_entropy_carries_no_gradient_but_log_probs_do() -> None:
    model = FixedLogits([0.3, -0.2])
    model.logits.requires_grad_(True)
    batch = pack([[1]], [[1, 1]], pad_id=0)
    token, entropy = packed_logprobs(model, batch, 1.0, with_entropy=True)
    assert token.requires_grad and not entropy.requires_grad


@pytest.mark.parametrize(
    ("logits_dtype", "scored_dtype"),
    [
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_log_probs_are_at_least_fp32_and_never_below_the_logits(
    logits_dtype: torch.dtype, scored_dtype: torch.dtype
) -> None:
    # p(token 1) = 1 / (1 + e^-x) with x = 1e-9: fp32 rounds the difference from ln(1/2) away
    model = FixedLogits([0.0, 1e-9])
    model.logits = model.logits.to(logits_dtype)
    batch = pack([[1]], [[1, 0]], pad_id=0)
    token, entropy = packed_logprobs(model, batch, 1.0, with_entropy=True)
    assert token.dtype == entropy.dtype == scored_dtype
    if scored_dtype == torch.float64:
        assert token[0, 0].item() == pytest.approx(-math.log1p(math.exp(-1e-9)), rel=1e-15)
