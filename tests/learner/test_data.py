from __future__ import annotations

import math

import pytest

from learner.data import Completion, Group, collate, micro_batches, plan_step, step_micro_batches
from learner.loss import grpo_loss


def _c(prompt: list[int], comp: list[int]) -> Completion:
    return Completion(prompt, comp, [-0.5] * len(comp))


GROUPS = [
    Group([_c([5, 6], [7, 2]), _c([5, 6], [8, 9, 2])], [1.0, 0.0]),
    Group([_c([4], [3]), _c([4], [3, 3, 3, 2])], [0.5, 0.5]),  # all equal
]


@pytest.mark.parametrize(
    ("loss_type", "norm"), [("dapo", 2 + 3 + 1 + 4), ("grpo", 4), ("dr_grpo", 4 * 8)]
)
def test_plan_counts_every_completion_in_the_normaliser(loss_type, norm) -> None:  # type: ignore[no-untyped-def]
    plan = plan_step(
        GROUPS,
        loss_type=loss_type,
        scale_rewards="group",
        max_completion_tokens=8,
        skip_zero_advantage=True,
    )
    assert plan.normaliser == norm
    assert len(plan.sequences) == 2  # the all-equal group is skipped
    a = 0.5 / (math.sqrt(0.5) + 1e-4)  # r = (1, 0): mean 0.5, sample std sqrt(0.5)
    assert [s.advantage for s in plan.sequences] == pytest.approx([a, -a])
    assert plan.zero_advantage_groups == 1
    assert plan.reward_mean == pytest.approx(0.5)


def test_skipping_all_equal_groups_does_not_change_the_loss() -> None:
    def loss_of(skip: bool) -> float:
        plan = plan_step(
            GROUPS,
            loss_type="dapo",
            scale_rewards="group",
            max_completion_tokens=8,
            skip_zero_advantage=skip,
        )
        mb = collate(plan.sequences, pad_id=0)
        # a current policy that depends only on the token: the same per token in both layouts
        logp = mb.behaviour_logprobs + 0.03 * mb.packed.completion_ids.float()
        loss, _ = grpo_loss(
            logp,
            mb.behaviour_logprobs,
            mb.advantages,
            mb.completion_mask,
            epsilon_low=0.2,
            epsilon_high=0.28,
            loss_type="dapo",
            normaliser=plan.normaliser,
        )
        return loss.item()

    assert loss_of(True) == pytest.approx(loss_of(False), abs=1e-6)


def test_collate_aligns_completion_tokens_and_eos() -> None:
    plan = plan_step(
        GROUPS,
        loss_type="dapo",
        scale_rewards="none",
        max_completion_tokens=8,
        skip_zero_advantage=False,
    )
    mb = collate(plan.sequences, pad_id=2)
    # prompts left-padded to 2, completions right-padded to 4 (lm.logprobs.pack's layout)
    assert mb.packed.input_ids[2].tolist() == [2, 4, 3, 2, 2, 2]
    assert mb.packed.attention_mask[2].tolist() == [0, 1, 1, 0, 0, 0]
    assert mb.completion_mask[0].tolist() == [1, 1, 0, 0]  # the EOS (id 2) is counted
    assert mb.completion_mask[3].tolist() == [1, 1, 1, 1]
    assert mb.behaviour_logprobs[1].tolist() == [-0.5, -0.5, -0.5, 0.0]
    assert mb.advantages.tolist() == [0.5, -0.5, 0.0, 0.0]


def test_micro_batches_respect_the_token_budget() -> None:
    # padded size = count × (longest prompt + longest completion)
    assert micro_batches([(2, 1), (1, 2), (1, 1), (4, 1), (1, 1)], 9) == [[0, 1], [2], [3], [4]]
    assert micro_batches([(1, 1), (1, 1), (1, 1), (1, 1)], 6) == [[0, 1, 2], [3]]
    assert micro_batches([(10, 10), (1, 1)], 8) == [[0], [1]]  # too long: alone
    plan = plan_step(
        GROUPS,
        loss_type="dapo",
        scale_rewards="group",
        max_completion_tokens=8,
        skip_zero_advantage=False,
    )
    mbs = step_micro_batches(plan, token_budget=10, pad_id=0)
    assert sum(mb.packed.input_ids.shape[0] for mb in mbs) == 4
    assert all(mb.packed.input_ids.numel() <= 10 for mb in mbs)
