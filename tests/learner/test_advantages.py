from __future__ import annotations

import math

import pytest
import torch

from learner.advantages import group_advantages, zero_advantage_groups


def test_group_scaling_uses_the_sample_std() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    adv = group_advantages(rewards, "group")
    # mean 0.5; sample std = sqrt(4 × 0.25 / 3) = sqrt(1/3)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    torch.testing.assert_close(adv[0], torch.tensor([a, -a, -a, a]))
    torch.testing.assert_close(adv[1], torch.zeros(4))  # 0 / (0 + 1e-4)


def test_no_scaling_only_centres() -> None:
    rewards = torch.tensor([[3.0, 0.0, 0.0]])
    torch.testing.assert_close(group_advantages(rewards, "none"), torch.tensor([[2.0, -1.0, -1.0]]))


def test_zero_advantage_groups_and_bad_shapes() -> None:
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert zero_advantage_groups(rewards).tolist() == [True, False]
    with pytest.raises(ValueError):
        group_advantages(torch.ones(3, 1))
