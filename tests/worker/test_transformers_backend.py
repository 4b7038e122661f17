"""The transformers backend on the real small model: behaviour log-probs equal a forward pass
of the same model + adapter on the same tokens (lm.logprobs), with and without an adapter.

Tolerance (fp32, CPU): mean |Δ| < 1e-4 and max |Δ| < 1e-3 (measured: ~3e-6 / ~7e-5).
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from lm.adapter_io import load_adapter_version
from lm.logprobs import completion_logprobs
from worker.adapters import AdapterHandle
from worker.backends.base import Completion, GenerationCancelled, SamplingSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RUN = str(uuid.UUID(int=7))
T = 0.7
MEAN_TOL, MAX_TOL = 1e-4, 1e-3


def handle(version: int, path: Path) -> AdapterHandle:
    return AdapterHandle(RUN, version, f"{version:064x}", path)


def deltas(
    reference: Any, prompts: list[list[int]], completions: list[Completion], eos: int
) -> torch.Tensor:
    expected = completion_logprobs(
        reference,
        [prompts[c.prompt_index] for c in completions],
        [c.token_ids for c in completions],
        T,
        pad_id=eos,
    )
    return torch.cat(
        [
            (torch.tensor(e) - torch.tensor(c.logprobs)).abs()
            for e, c in zip(expected, completions, strict=True)
        ]
    )


def check_shape(
    completions: list[Completion], n_prompts: int, g: int, eos: set[int], max_new: int = 16
) -> None:
    assert [(c.prompt_index, c.group_index) for c in completions] == [
        (p, i) for p in range(n_prompts) for i in range(g)
    ]
    for c in completions:
        assert len(c.token_ids) == len(c.logprobs) > 0
        assert all(lp <= 0 for lp in c.logprobs)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in eos  # the EOS is kept: part of the completion, trained
            assert not eos & set(c.token_ids[:-1])
        else:
            assert len(c.token_ids) == max_new and not eos & set(c.token_ids)


def test_base_model_logprobs_match_forward_pass(
    tx_backend: Any, small_model: Any, prompt_ids: list[list[int]]
) -> None:
    out = tx_backend.generate(prompt_ids, 4, SamplingSpec(T, 16, seed=11), None)
    check_shape(out, len(prompt_ids), 4, set(tx_backend.eos_ids))
    d = deltas(small_model, prompt_ids, out, tx_backend.pad_id)
    assert d.mean().item() < MEAN_TOL and d.max().item() < MAX_TOL, (d.mean(), d.max())
    # The same seed samples the same completions.
    again = tx_backend.generate(prompt_ids, 4, SamplingSpec(T, 16, seed=11), None)
    assert [c.token_ids for c in again] == [c.token_ids for c in out]


def test_adapter_logprobs_match_forward_pass_and_switch(
    tx_backend: Any,
    small_model: Any,
    prompt_ids: list[list[int]],
    adapter_dirs: dict[int, Path],
) -> None:
    prompts = prompt_ids[:1]
    results = {}
    for version in (1, 2):
        out = tx_backend.generate(
            prompts, 4, SamplingSpec(T, 16, seed=5), handle(version, adapter_dirs[version])
        )
        reference = load_adapter_version(copy.deepcopy(small_model), adapter_dirs[version])
        d = deltas(reference, prompts, out, tx_backend.pad_id)
        assert d.mean().item() < MEAN_TOL and d.max().item() < MAX_TOL, (version, d.max())
        # The adapter really was applied: the base model scores these tokens differently.
        d_base = deltas(small_model, prompts, out, tx_backend.pad_id)
        assert d_base.mean().item() > 100 * MEAN_TOL
        results[version] = out
    # max_loaded_adapters=1: v2 took v1's slot, its weights copied in (same shape: no new
    # adapter built), and scores exactly as a fresh PEFT load of v2 (checked above).
    assert (tx_backend.adapter_loads, tx_backend.adapter_writes) == (2, 1)
    # Back to the base model after adapters were loaded: the adapter is disabled.
    base = tx_backend.generate(prompts, 4, SamplingSpec(T, 16, seed=5), None)
    d = deltas(small_model, prompts, base, tx_backend.pad_id)
    assert d.max().item() < MAX_TOL


def test_cancel_stops_generation_at_once(tx_backend: Any, prompt_ids: list[list[int]]) -> None:
    cancel = threading.Event()
    timer = threading.Timer(0.3, cancel.set)
    timer.start()
    started = time.monotonic()
    with pytest.raises(GenerationCancelled):
        tx_backend.generate(prompt_ids, 4, SamplingSpec(T, 2000, seed=1), None, cancel)
    assert time.monotonic() - started < 5.0


def greedy_gaps(model: Any, prompts: list[list[int]], completions: list[Any]) -> list[float]:
    """For each completion token: max logit − the token's logit under a teacher-forced forward
    pass of `model` (0 when the token is the argmax). Completions as dicts or Completions."""
    gaps = []
    for c in completions:
        tokens = c["token_ids"] if isinstance(c, dict) else c.token_ids
        index = c["prompt_index"] if isinstance(c, dict) else c.prompt_index
        prompt = prompts[index]
        ids = torch.tensor([prompt + tokens])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        chosen = logits.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)
        gaps.extend((logits.max(dim=1).values - chosen).tolist())
    return gaps


def test_temperature_zero_is_greedy_whatever_the_seed(
    tx_backend: Any, small_model: Any, prompt_ids: list[list[int]]
) -> None:
    """Eval leases at temperature 0: the argmax token at every step, the same for any seed."""
    first = tx_backend.generate(prompt_ids, 1, SamplingSpec(0.0, 8, seed=1), None)
    again = tx_backend.generate(prompt_ids, 1, SamplingSpec(0.0, 8, seed=99), None)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert max(greedy_gaps(small_model, prompt_ids, first)) < 1e-3
