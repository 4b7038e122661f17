"""On the real small model: with one prompt and a reward that prefers one completion, that
completion's probability rises after a few GRPO optimizer steps."""

from __future__ import annotations

import pytest
import torch

from learner.data import Completion, Group, collate, plan_step
from learner.trainer import Trainer, add_lora, completion_logprobs
from protocol.run_config import RunConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _config() -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "direction",
            "base_model": "smollm2-135m-instruct",
            "dataset": {"kind": "jsonl", "rows": [{"prompt": "What is 7+5?", "answer": 12}]},
            "rewards": [{"name": "numeric_match"}],
            "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "grpo": {"learning_rate": 5e-3},
            "group_size": 4,
            "prompts_per_lease": 1,
            "prompts_per_step": 1,
        }
    )


def _sequence_logprob(model, prompt: list[int], completion: list[int]) -> float:  # type: ignore[no-untyped-def]
    plan = plan_step(
        [Group([Completion(prompt, completion, [0.0] * len(completion))] * 2, [1.0, 0.0])],
        loss_type="dapo",
        scale_rewards="none",
        max_completion_tokens=8,
        skip_zero_advantage=False,
    )
    with torch.no_grad():
        logp, _ = completion_logprobs(model, collate(plan.sequences[:1], pad_id=2), 1.0)
    return float(logp.sum())


def test_preferred_completion_becomes_more_likely() -> None:
    from lm.models import load_model, load_tokenizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = _config()
    tokenizer = load_tokenizer(config.base_model)
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
    before_good = _sequence_logprob(model, prompt, good)
    before_bad = _sequence_logprob(model, prompt, bad)
    for _ in range(3):
        completions = []
        for tokens in (good, bad, good, bad):  # behaviour = the current policy (on-policy)
            plan = plan_step(
                [Group([Completion(prompt, tokens, [0.0] * len(tokens))] * 2, [0.0, 1.0])],
                loss_type="dapo",
                scale_rewards="none",
                max_completion_tokens=8,
                skip_zero_advantage=False,
            )
            with torch.no_grad():
                lp, _ = completion_logprobs(model, collate(plan.sequences[:1], pad_id=eos), 1.0)
            completions.append(Completion(prompt, tokens, lp[0].tolist()))
        metrics = trainer.train_step([Group(completions, [1.0, 0.0, 1.0, 0.0])])
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    after_good = _sequence_logprob(model, prompt, good)
    after_bad = _sequence_logprob(model, prompt, bad)
    assert after_good > before_good + 0.05
    assert after_bad < before_bad - 0.05
    assert trainer.step == 3
