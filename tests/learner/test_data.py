from __future__ import annotations

import math
import random

import pytest

from learner.data import (
    Completion,
    Group,
    collate,
    micro_batches,
    padding_fraction,
    plan_step,
    step_micro_batches,
)
from learner.loss import grpo_loss


def _c(prompt: list[int], comp: list[int]) -> Completion:
    return Completion(prompt, comp, [-0.5] * len(comp))


GROUPS = [
    Group([_c([5, 6], [7, 2]), _c([5, 6], [8, 9, 2])], [1.0, 0.0]),
    Group([_c([4], [3]), _c([4], [3, 3, 3, 2])], [0.5, 0.5]),  # all equal
]


@pytest.mark.parametrize(
    ("loss_type", "norm"),
    [("dapo", 2 + 3 + 1 + 4), ("cispo", 2 + 3 + 1 + 4), ("grpo", 4), ("dr_grpo", 4 * 8)],
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


def test_in_order_micro_batches_respect_the_token_budget() -> None:
    # padded size = count × (longest prompt + longest completion)
    sizes = [(2, 1), (1, 2), (1, 1), (4, 1), (1, 1)]
    assert micro_batches(sizes, 9, by_length=False) == [[0, 1], [2], [3], [4]]
    assert micro_batches([(1, 1)] * 4, 6, by_length=False) == [[0, 1, 2], [3]]
    assert micro_batches([(10, 10), (1, 1)], 8, by_length=False) == [[0], [1]]  # too long: alone
    plan = plan_step(
        GROUPS,
        loss_type="dapo",
        scale_rewards="group",
        max_completion_tokens=8,
        skip_zero_advantage=False,
    )
    for by_length in (False, True):
        mbs = step_micro_batches(plan, token_budget=10, pad_id=0, by_length=by_length)
        assert sum(mb.packed.input_ids.shape[0] for mb in mbs) == 4
        assert all(mb.packed.input_ids.numel() <= 10 for mb in mbs)


def test_bucketing_groups_like_lengths_by_hand() -> None:
    # Longest completion first: 1 (1, 8), 3 (1, 8), 0 (2, 2), 2 (1, 2), 4 (1, 1). By length the
    # two 8-token completions share one micro-batch (width 9, nothing padded) and the short
    # ones another (width 2 + 2: 1 + 2 = 3 of 12 padded): 3 of 30 positions, 0.10. In order,
    # 1 and 2, then 3 and 4 share width 9: 6 + 7 = 13 of 40 positions padded.
    sizes = [(2, 2), (1, 8), (1, 2), (1, 8), (1, 1)]
    assert micro_batches(sizes, 18) == [[1, 3], [0, 2, 4]]
    assert micro_batches(sizes, 18, by_length=False) == [[0], [1, 2], [3, 4]]


def test_a_sequence_longer_than_the_budget_goes_alone() -> None:
    sizes = [(4, 3), (40, 100), (4, 2), (3, 3)]
    parts = micro_batches(sizes, 20)
    assert [1] in parts
    assert sorted(i for part in parts for i in part) == [0, 1, 2, 3]


def lognormal_mix(seed: int, *, median: float = 256, sigma: float = 0.75, cap: int = 1024):
    """8 prompts (24–96 tokens) × 8 completions, lognormal lengths capped at `cap`."""
    rng = random.Random(seed)
    sizes = []
    for _ in range(8):
        prompt = rng.randint(24, 96)
        for _ in range(8):
            length = round(math.exp(rng.gauss(math.log(median), sigma)))
            sizes.append((prompt, min(cap, max(1, length))))
    return sizes


def padded_share(sizes: list[tuple[int, int]], parts: list[list[int]]) -> float:
    computed = sum(
        len(p) * (max(sizes[i][0] for i in p) + max(sizes[i][1] for i in p)) for p in parts
    )
    return 1 - sum(a + b for a, b in sizes) / computed


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("median", "cap", "budget"), [(256, 1024, 4096), (128, 512, 2048)])
def test_bucketing_pads_at_most_a_tenth_of_a_long_tailed_mix(seed, median, cap, budget) -> None:  # type: ignore[no-untyped-def]
    sizes = lognormal_mix(seed, median=median, cap=cap)
    parts = micro_batches(sizes, budget)
    assert sorted(i for part in parts for i in part) == list(range(len(sizes)))  # each once
    for part in parts:
        width = max(sizes[i][0] for i in part) + max(sizes[i][1] for i in part)
        assert len(part) * width <= budget
    assert padded_share(sizes, parts) <= 0.10
    in_order = micro_batches(sizes, budget, by_length=False)
    assert padded_share(sizes, in_order) > 0.25  # what the in-order rule pads on this mix
    # not one row each: fewer than half as many micro-batches as rows
    assert len(parts) < len(sizes) / 2


def test_padding_fraction_of_packed_micro_batches() -> None:
    plan = plan_step(
        GROUPS,
        loss_type="dapo",
        scale_rewards="none",
        max_completion_tokens=8,
        skip_zero_advantage=False,
    )
    mb = collate(plan.sequences, pad_id=0)  # 4 rows × (2 + 4): 4 + 5 + 2 + 5 = 16 real of 24
    assert padding_fraction([mb]) == pytest.approx(8 / 24)
    assert padding_fraction([]) == 0.0
