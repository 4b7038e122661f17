"""learner/frozen.py: a spot-check scores with the weights of the batch's version, kept from
when that version was handed to the publisher, while training has moved the model on."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model

from learner.frozen import FrozenWeights
from lm.adapter_io import snapshot_adapter
from lm.logprobs import completion_logprobs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PROMPTS = [[1, 2, 3, 4], [5, 6, 7]]
COMPLETIONS = [[10, 11, 12], [13, 14]]


@pytest.fixture
def model(small_model: Any) -> Any:
    torch.set_num_threads(1)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    peft = get_peft_model(copy.deepcopy(small_model), config)
    peft.eval()
    return peft


def _move(model: Any, seed: int) -> None:
    """What optimizer steps do: every trainable weight changes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)


def _score(model: Any, use_adapter: bool = True) -> list[list[float]]:
    return completion_logprobs(model, PROMPTS, COMPLETIONS, 1.0, pad_id=0, use_adapter=use_adapter)


def test_scoring_with_a_version_uses_its_weights_and_puts_the_trained_ones_back(
    model: Any,
) -> None:
    frozen = FrozenWeights(max_staleness=1)
    _move(model, 1)
    frozen.keep(1, snapshot_adapter(model))
    at_v1 = _score(model)
    _move(model, 2)  # the next steps train on
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    now = _score(model)
    assert now != at_v1
    with frozen.scoring_with(model, 1) as use_adapter:
        assert use_adapter
        assert _score(model) == at_v1
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, trained[name])
    assert _score(model) == now
    with frozen.scoring_with(model, 0) as use_adapter:  # version 0: the base model
        assert not use_adapter
        assert _score(model) == _score(model, use_adapter=False)


def test_versions_are_kept_while_their_batches_can_arrive(model: Any) -> None:
    frozen = FrozenWeights(max_staleness=1)
    for version in (1, 2, 3):
        frozen.keep(version, snapshot_adapter(model))
    frozen.prune(published_version=3)  # batches of version 2 may still be trained into 4
    assert frozen.versions == [2, 3] and frozen.has(0) and not frozen.has(1)
