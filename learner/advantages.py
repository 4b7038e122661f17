"""Group-relative advantages (docs/architecture/loss.md, "Sampling, log-probs and the GRPO
loss")."""

from __future__ import annotations

import torch

from protocol.run_config import ScaleRewards

STD_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, scale_rewards: ScaleRewards = "group") -> torch.Tensor:
    """Advantages of rewards (N, G) — N groups of G completions — as (N, G).

    `group`: A_i = (r_i − mean(r)) / (std(r) + 1e-4), sample std (Bessel-corrected, torch's
    default, as TRL); `none`: A_i = r_i − mean(r)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (N, G) with G >= 2, got {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (N, G)
    if scale_rewards == "group":
        return centred / (rewards.std(dim=1, keepdim=True) + STD_EPS)
    if scale_rewards == "none":
        return centred
    raise ValueError(f"unknown scale_rewards {scale_rewards!r}")


def zero_advantage_groups(rewards: torch.Tensor) -> torch.Tensor:
    """(N,) bool: groups whose rewards are all equal (they carry no policy gradient)."""
    return (rewards == rewards[:, :1]).all(dim=1)
