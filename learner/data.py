"""Batches → tensors: one optimizer step's sequences, micro-batches by token budget, padding.

A step is a list of groups (G completions of one prompt, with their rewards). Advantages are
computed per group; when β = 0, groups whose rewards are all equal are left out of the
forward/backward (their advantages are 0, so they add nothing), but the step's normaliser
(design.md) still counts every completion of the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from learner.advantages import group_advantages, zero_advantage_groups
from learner.loss import LossType


@dataclass(frozen=True)
class Completion:
    """One completion: its prompt's token ids, its own token ids (up to and including the EOS)
    and the behaviour log-prob of each completion token."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.behaviour_logprobs):
            raise ValueError("one behaviour log-prob per completion token")

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass(frozen=True)
class Group:
    """G completions of one prompt and their rewards (same order)."""

    completions: Sequence[Completion]
    rewards: Sequence[float]


@dataclass(frozen=True)
class TrainSequence:
    completion: Completion
    advantage: float


@dataclass(frozen=True)
class StepPlan:
    """What one optimizer step trains on and how it is normalised."""

    sequences: list[TrainSequence]  # the trained completions (all-equal groups left out)
    normaliser: float  # over every completion of the step
    n_groups: int
    n_completions: int
    n_completion_tokens: int
    zero_advantage_groups: int
    reward_mean: float
    reward_std: float


def plan_step(
    groups: Sequence[Group],
    *,
    loss_type: LossType,
    scale_rewards: str,
    max_completion_tokens: int,
    skip_zero_advantage: bool,
) -> StepPlan:
    """Advantages per group, the sequences to train on and the step's normaliser."""
    if not groups:
        raise ValueError("a step needs at least one group")
    sizes = {len(g.completions) for g in groups}
    if len(sizes) != 1 or any(len(g.rewards) != len(g.completions) for g in groups):
        raise ValueError("every group needs the same size and one reward per completion")
    rewards = torch.tensor([list(g.rewards) for g in groups], dtype=torch.float64)  # (N, G)
    adv = group_advantages(rewards, scale_rewards)  # type: ignore[arg-type]
    zero = zero_advantage_groups(rewards)  # (N,)
    sequences = [
        TrainSequence(c, float(adv[i, j]))
        for i, g in enumerate(groups)
        if not (skip_zero_advantage and bool(zero[i]))
        for j, c in enumerate(g.completions)
    ]
    n_completions = rewards.numel()
    n_tokens = sum(len(c.completion_ids) for g in groups for c in g.completions)
    if loss_type == "dapo":
        normaliser = float(n_tokens)
    elif loss_type == "grpo":
        normaliser = float(n_completions)
    else:
        normaliser = float(n_completions * max_completion_tokens)
    return StepPlan(
        sequences=sequences,
        normaliser=normaliser,
        n_groups=len(groups),
        n_completions=n_completions,
        n_completion_tokens=n_tokens,
        zero_advantage_groups=int(zero.sum()),
        reward_mean=float(rewards.mean()),
        reward_std=float(rewards.std()) if n_completions > 1 else 0.0,
    )


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Split indices (in order) into micro-batches whose padded size (count × longest) stays
    within `token_budget`; a sequence longer than the budget goes alone."""
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > token_budget:
            out.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        out.append(current)
    return out


@dataclass
class MicroBatch:
    """Padded tensors of a micro-batch. The model input is [prompt | completion | pad] per row
    (right padding, attention mask 0 on pad); the completion-aligned tensors are (B, T) with
    T the longest completion."""

    input_ids: torch.Tensor  # (B, L) long
    attention_mask: torch.Tensor  # (B, L) long
    prompt_lengths: torch.Tensor  # (B,) long
    completion_ids: torch.Tensor  # (B, T) long, pad 0
    completion_mask: torch.Tensor  # (B, T) float, 1 on every completion token (EOS included)
    behaviour_logprobs: torch.Tensor  # (B, T) float32
    advantages: torch.Tensor  # (B,) float32

    @property
    def logit_positions(self) -> torch.Tensor:
        """(B, T): the input position whose logits predict each completion token."""
        t = self.completion_ids.shape[1]
        return self.prompt_lengths[:, None] - 1 + torch.arange(t)[None, :]

    def to(self, device: str | torch.device) -> MicroBatch:
        for name, value in vars(self).items():
            setattr(self, name, value.to(device))
        return self


def collate(items: Sequence[TrainSequence], pad_id: int) -> MicroBatch:
    """Pad a micro-batch's sequences into tensors."""
    b = len(items)
    seq_len = max(c.completion.length for c in items)
    t = max(max(len(c.completion.completion_ids) for c in items), 1)
    input_ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    attention = torch.zeros((b, seq_len), dtype=torch.long)
    comp = torch.zeros((b, t), dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.float32)
    behaviour = torch.zeros((b, t), dtype=torch.float32)
    prompt_lengths = torch.zeros(b, dtype=torch.long)
    for i, item in enumerate(items):
        c = item.completion
        p, n = len(c.prompt_ids), len(c.completion_ids)
        input_ids[i, : p + n] = torch.tensor([*c.prompt_ids, *c.completion_ids])
        attention[i, : p + n] = 1
        comp[i, :n] = torch.tensor(list(c.completion_ids), dtype=torch.long)
        mask[i, :n] = 1.0
        behaviour[i, :n] = torch.tensor(list(c.behaviour_logprobs), dtype=torch.float32)
        prompt_lengths[i] = p
    advantages = torch.tensor([item.advantage for item in items], dtype=torch.float32)
    return MicroBatch(input_ids, attention, prompt_lengths, comp, mask, behaviour, advantages)


def step_micro_batches(plan: StepPlan, token_budget: int, pad_id: int) -> list[MicroBatch]:
    """The step's trained sequences, packed into padded micro-batches by token budget."""
    seqs = plan.sequences
    parts = micro_batches([s.completion.length for s in seqs], token_budget)
    return [collate([seqs[i] for i in idx], pad_id) for idx in parts]
