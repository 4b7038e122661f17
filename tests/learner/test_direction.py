"""On the real small model: with one prompt and a reward that prefers one completion, that
completion's probability rises after a few GRPO optimizer steps, with each loss variant."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from learner.data import Completion, Group
from learner.trainer import Trainer, add_lora
from lm.logprobs import completion_logprobs
from protocol.run_config import RunConfig
from tests.harness.runs import jsonl, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


VARIANTS = {
    "dapo-token": {},
    # GSPO as its paper: sequence-level ratio, grpo aggregation, its small ε
    "gspo": {
        "loss_type": "grpo",
        "importance_level": "sequence",
        "epsilon_low": 3e-4,
        "epsilon_high": 4e-4,
    },
    "cispo": {"loss_type": "cispo", "epsilon_low": 1.0, "epsilon_high": 0.28},
}


def _config(grpo: dict[str, Any]) -> RunConfig:
    return RunConfig.model_validate(
        run_config(
            name="direction",
            dataset=jsonl([{"prompt": "What is 7+5?", "answer": 12}]),
            lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            grpo={"learning_rate": 5e-3, **grpo},
            group_size=4,
            prompts_per_lease=1,
            prompts_per_step=1,
        )
    )


def _sequence_logprob(model, prompt: list[int], completion: list[int], eos: int) -> float:  # type: ignore[no-untyped-def]
    return sum(completion_logprobs(model, [prompt], [completion], 1.0, pad_id=eos)[0])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_preferred_completion_becomes_more_likely(small_tokenizer: Any, variant: str) -> None:
    from lm.models import load_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = _config(VARIANTS[variant])
    tokenizer = small_tokenizer
    # trained in place, so never the shared small_model; a reload costs less than a deep copy
    model = add_lora(load_model(config.base_model), config)
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 7+5?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    good = tokenizer.encode("12", add_special_tokens=False) + [eos]
    bad = tokenizer.encode("13", add_special_tokens=False) + [eos]
    trainer = Trainer(model, config, pad_id=eos)
    before_good = _sequence_logprob(model, prompt, good, eos)
    before_bad = _sequence_logprob(model, prompt, bad, eos)
    for _ in range(3):
        tokens = [good, bad, good, bad]
        # behaviour = the current policy (on-policy)
        behaviour = completion_logprobs(model, [prompt] * 4, tokens, 1.0, pad_id=eos)
        completions = [Completion(prompt, t, b) for t, b in zip(tokens, behaviour, strict=True)]
        metrics = trainer.train_step([Group(completions, [1.0, 0.0, 1.0, 0.0])])
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert metrics["clip_low"] == metrics["clip_high"] == 0.0  # on-policy: nothing clipped
        # mean entropy over the completion tokens: positive, below a uniform distribution's
        assert 0.0 < metrics["entropy"] < math.log(len(tokenizer))
    after_good = _sequence_logprob(model, prompt, good, eos)
    after_bad = _sequence_logprob(model, prompt, bad, eos)
    assert after_good > before_good + 0.05
    assert after_bad < before_bad - 0.05
    assert trainer.step == 3
