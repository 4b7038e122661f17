"""Batches → tensors: one optimizer step's sequences, length-bucketed micro-batches by token
budget, padding.

A step is a list of groups (G completions of one prompt, with their rewards). Advantages are
computed per group; when β = 0, groups whose rewards are all equal are left out of the
forward/backward (their advantages are 0, so they add nothing), but the step's normaliser
(docs/architecture/loss.md, "Sampling, log-probs and the GRPO loss") still counts every
completion of the step.

A multi-turn trajectory is a `Completion` too: its prompt span is the prompt, every later
token (model turns and environment turns) the "completion", with a `loss_mask` that is 1 on
model tokens only. The whole trajectory goes through the model in one forward pass
(environment tokens are context); the loss, its normalisers and the metrics count only the
masked-in tokens (docs/architecture/environments.md, "Environments and trajectories"). A single-turn
completion has no mask (every completion token is a model token): exactly the old path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from learner.advantages import group_advantages, zero_advantage_groups
from lm.logprobs import PackedBatch, pack
from protocol.batch_reader import TrajectoryRecord
from protocol.run_config import LossType, ScaleRewards
from protocol.trajectories import Trajectory


@dataclass(frozen=True)
class Completion:
    """One completion: its prompt's token ids, its own token ids (up to and including the EOS)
    and the behaviour log-prob of each completion token.

    A trajectory (`from_trajectory`): everything after the prompt span, with `loss_mask` 1 on
    model tokens and 0 on environment tokens (whose behaviour log-prob is a placeholder 0.0,
    never read). `loss_mask` None: every completion token is trained (single-turn)."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]
    loss_mask: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.behaviour_logprobs):
            raise ValueError("one behaviour log-prob per completion token")
        if self.loss_mask is not None and len(self.loss_mask) != len(self.completion_ids):
            raise ValueError("one loss-mask entry per completion token")

    @classmethod
    def from_trajectory(cls, t: Trajectory | TrajectoryRecord) -> Completion:
        """The trajectory's prompt span as the prompt, the rest with its loss mask (a batch
        row of either format, as `read_trajectories` gives it)."""
        p = t.prompt_tokens
        return cls(
            prompt_ids=t.token_ids[:p],
            completion_ids=t.token_ids[p:],
            behaviour_logprobs=[0.0 if lp is None else lp for lp in t.logprobs[p:]],
            loss_mask=t.loss_mask[p:],
        )

    @property
    def model_tokens(self) -> int:
        """Trained tokens: what `|o_i|` and the normalisers count."""
        if self.loss_mask is None:
            return len(self.completion_ids)
        return sum(self.loss_mask)


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
    scale_rewards: ScaleRewards,
    max_completion_tokens: int,
    skip_zero_advantage: bool,
    max_total_tokens: int | None = None,
) -> StepPlan:
    """Advantages per group, the sequences to train on and the step's normaliser.

    The normaliser counts model tokens only: `dapo`/`cispo` the step's model tokens, `grpo`
    its completions, `dr_grpo` Σ over completions of the most model tokens one can hold:
    `max_completion_tokens` (max_turns × the per-turn max_new_tokens), bounded by
    `max_total_tokens` − its prompt when the run's environment sets a token budget."""
    if not groups:
        raise ValueError("a step needs at least one group")
    sizes = {len(g.completions) for g in groups}
    if len(sizes) != 1 or any(len(g.rewards) != len(g.completions) for g in groups):
        raise ValueError("every group needs the same size and one reward per completion")
    rewards = torch.tensor([list(g.rewards) for g in groups], dtype=torch.float64)  # (N, G)
    adv = group_advantages(rewards, scale_rewards)
    zero = zero_advantage_groups(rewards)  # (N,)
    sequences = [
        TrainSequence(c, float(adv[i, j]))
        for i, g in enumerate(groups)
        if not (skip_zero_advantage and bool(zero[i]))
        for j, c in enumerate(g.completions)
    ]
    n_completions = rewards.numel()
    n_tokens = sum(c.model_tokens for g in groups for c in g.completions)
    if loss_type in ("dapo", "cispo"):
        normaliser = float(n_tokens)
    elif loss_type == "grpo":
        normaliser = float(n_completions)
    else:
        normaliser = float(
            sum(
                _most_model_tokens(c, max_completion_tokens, max_total_tokens)
                for g in groups
                for c in g.completions
            )
        )
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


def _most_model_tokens(c: Completion, per_completion: int, max_total: int | None) -> int:
    if max_total is None:
        return per_completion
    return max(min(per_completion, max_total - len(c.prompt_ids)), 1)


MAX_PADDING_FRACTION = 0.10  # of a step's computed positions, when grouping by length
_LAMBDA_BISECTIONS = 10  # λ to budget / 1024: finer changes no cut that matters


def micro_batches(
    sizes: Sequence[tuple[int, int]],
    token_budget: int,
    *,
    by_length: bool = True,
    max_padding: float = MAX_PADDING_FRACTION,
) -> list[list[int]]:
    """Group sequence indices into micro-batches whose padded size — count × (longest prompt +
    longest completion), lm.logprobs.pack's layout — stays within `token_budget`. `sizes` holds
    (prompt tokens, completion tokens) per sequence; one over the budget goes alone. Every
    index lands in exactly one micro-batch; the result is deterministic.

    `by_length` (the learner's rule): order the sequences longest completion first (ties:
    longest prompt, then index) and cut that order into runs: of the cuts within the budget,
    the one minimising computed positions + λ per micro-batch, with λ (the price of one more
    micro-batch, in positions) the budget when that cut pads ≤ `max_padding` of the computed
    positions, else the largest found by bisection that does (`_cut`). So few, full
    micro-batches, and little padding even on a long-tailed mix. Otherwise the sequences' own
    order, filled greedily (the old rule, kept for the benchmark's baseline). The grouping
    changes neither the loss nor its gradient (every micro-batch divides by the step's
    normaliser), only rounding."""
    if not by_length:
        return _in_order(sizes, token_budget)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i][1], -sizes[i][0], i))
    rows = [sizes[i] for i in order]
    runs = _cut(rows, token_budget, float(token_budget))  # fewest micro-batches, nearly
    if _padding(rows, runs) <= max_padding:
        return [[order[i] for i in run] for run in runs]
    best = _cut(rows, token_budget, 0.0)  # λ = 0: fewest positions (often one row each)
    low, high = 0.0, float(token_budget)
    for _ in range(_LAMBDA_BISECTIONS):
        price = (low + high) / 2
        runs = _cut(rows, token_budget, price)
        if _padding(rows, runs) <= max_padding:
            best, low = runs, price
        else:
            high = price
    return [[order[i] for i in run] for run in best]


def _width(rows: Sequence[tuple[int, int]]) -> int:
    """Padded row length of a micro-batch: longest prompt + longest completion (>= 1)."""
    return max(p for p, _ in rows) + max(max(c for _, c in rows), 1)


def _padding(rows: Sequence[tuple[int, int]], runs: Sequence[Sequence[int]]) -> float:
    computed = sum(len(run) * _width([rows[i] for i in run]) for run in runs)
    real = sum(p + c for p, c in rows)
    return (computed - real) / computed if computed else 0.0


def _cut(rows: Sequence[tuple[int, int]], token_budget: int, price: float) -> list[list[int]]:
    """The cut of `rows` (longest completion first) into contiguous runs within the budget that
    minimises Σ computed positions + `price` × runs: dynamic programming over where the last run
    begins. A run's longest completion is its first row's; its longest prompt is tracked."""
    n = len(rows)
    cost = [0.0] + [float("inf")] * n  # cost[j]: the best for rows[:j]
    start = [0] * (n + 1)  # start[j]: where the last run of that best begins
    for j in range(1, n + 1):
        width_p, best, best_i = 0, float("inf"), j - 1
        for i in range(j - 1, -1, -1):  # the last run is rows[i:j]
            p, c = rows[i]
            width_p = max(width_p, p)
            computed = (j - i) * (width_p + max(c, 1))
            if computed > token_budget and i < j - 1:
                break  # longer runs only grow
            total = cost[i] + computed
            if total < best:
                best, best_i = total, i
        cost[j], start[j] = best + price, best_i
    runs, j = [], n
    while j > 0:
        runs.append(list(range(start[j], j)))
        j = start[j]
    return runs[::-1]


def _in_order(sizes: Sequence[tuple[int, int]], token_budget: int) -> list[list[int]]:
    out: list[list[int]] = []
    current: list[int] = []
    width_p = width_c = 0
    for i, (p, c) in enumerate(sizes):
        wp, wc = max(width_p, p), max(width_c, c, 1)  # pack pads completions to >= 1
        if current and (len(current) + 1) * (wp + wc) > token_budget:
            out.append(current)
            current, wp, wc = [], p, max(c, 1)
        current.append(i)
        width_p, width_c = wp, wc
    if current:
        out.append(current)
    return out


@dataclass
class MicroBatch:
    """A micro-batch in lm.logprobs' generate-style layout (prompts left-padded, completions
    right-padded), with the completion-aligned behaviour log-probs and advantages."""

    packed: PackedBatch
    behaviour_logprobs: torch.Tensor  # (B, T) float32, 0 on padding and environment tokens
    advantages: torch.Tensor  # (B,) float32
    loss_mask: torch.Tensor  # (B, T) float32, 1 on model tokens, 0 on environment and padding

    @property
    def completion_mask(self) -> torch.Tensor:
        """(B, T) float: 1 on every trained token (model tokens, the EOS included), 0 on
        environment tokens and padding."""
        return self.packed.completion_mask.float() * self.loss_mask

    def to(self, device: str | torch.device) -> MicroBatch:
        p = self.packed
        packed = PackedBatch(
            input_ids=p.input_ids.to(device),
            attention_mask=p.attention_mask.to(device),
            position_ids=p.position_ids.to(device),
            completion_ids=p.completion_ids.to(device),
            completion_mask=p.completion_mask.to(device),
            prompt_width=p.prompt_width,
        )
        return MicroBatch(
            packed,
            self.behaviour_logprobs.to(device),
            self.advantages.to(device),
            self.loss_mask.to(device),
        )


def collate(items: Sequence[TrainSequence], pad_id: int) -> MicroBatch:
    """Pad a micro-batch's sequences into tensors (lm.logprobs.pack)."""
    packed = pack(
        [i.completion.prompt_ids for i in items],
        [i.completion.completion_ids for i in items],
        pad_id,
    )
    behaviour = torch.zeros(packed.completion_ids.shape, dtype=torch.float32)  # (B, T)
    loss_mask = torch.zeros(packed.completion_ids.shape, dtype=torch.float32)  # (B, T)
    for row, item in enumerate(items):
        values = list(item.completion.behaviour_logprobs)
        behaviour[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
        mask = item.completion.loss_mask
        if mask is None:
            loss_mask[row, : len(values)] = 1.0
        else:
            loss_mask[row, : len(values)] = torch.tensor(list(mask), dtype=torch.float32)
    advantages = torch.tensor([item.advantage for item in items], dtype=torch.float32)
    return MicroBatch(packed, behaviour, advantages, loss_mask)


def step_micro_batches(
    plan: StepPlan, token_budget: int, pad_id: int, *, by_length: bool = True
) -> list[MicroBatch]:
    """The step's trained sequences, packed into padded micro-batches by token budget
    (`micro_batches`)."""
    seqs = plan.sequences
    sizes = [(len(s.completion.prompt_ids), len(s.completion.completion_ids)) for s in seqs]
    parts = micro_batches(sizes, token_budget, by_length=by_length)
    return [collate([seqs[i] for i in idx], pad_id) for idx in parts]


@dataclass(frozen=True)
class Share:
    """One rank's part of a data-parallel step (learner/distributed.py): its sequences, the
    step's normaliser (over every completion of the step, on every rank) and how many
    micro-steps every rank runs — its own micro-batches, then empty ones that add nothing, so
    that all ranks run the same count."""

    sequences: list[TrainSequence]
    normaliser: float
    micro_steps: int


def split_shares(
    plan: StepPlan, ranks: int, token_budget: int, *, by_length: bool = True
) -> list[Share]:
    """Split the step's trained sequences (all-equal groups already left out) over `ranks`:
    longest first (prompt + completion tokens; ties: index), each to the rank with the fewest
    positions so far (ties: the lowest rank). Sequences are independent once their group's
    advantages are known, so a group may span ranks. Deterministic."""
    seqs = plan.sequences

    def size(s: TrainSequence) -> int:
        return len(s.completion.prompt_ids) + len(s.completion.completion_ids)

    order = sorted(range(len(seqs)), key=lambda i: (-size(seqs[i]), i))
    loads: list[int] = [0] * ranks
    parts: list[list[int]] = [[] for _ in range(ranks)]
    for i in order:
        rank = min(range(ranks), key=lambda r: (loads[r], r))
        parts[rank].append(i)
        loads[rank] += size(seqs[i])
    shares = [[seqs[i] for i in sorted(part)] for part in parts]
    counts = []
    for share in shares:
        sizes = [(len(s.completion.prompt_ids), len(s.completion.completion_ids)) for s in share]
        counts.append(len(micro_batches(sizes, token_budget, by_length=by_length)))
    steps = max(counts)
    return [Share(share, plan.normaliser, steps) for share in shares]


def empty_micro_batch(pad_id: int) -> MicroBatch:
    """A micro-batch of one pad token after a one-token prompt, masked out: its loss and
    gradient are 0, but its forward and backward run (a rank with fewer sequences than the
    others pads with these, so every rank runs the same collectives)."""
    return collate([TrainSequence(Completion([pad_id], [pad_id], [0.0], [0]), 0.0)], pad_id)


def positions(batches: Sequence[MicroBatch]) -> tuple[int, int]:
    """(computed, real) positions of `batches`: rows × (prompt width + completion width), and
    the attended ones among them."""
    computed = sum(mb.packed.input_ids.numel() for mb in batches)
    real = sum(int(mb.packed.attention_mask.sum()) for mb in batches)
    return computed, real


def padded_share(computed: int, real: int) -> float:
    """Padded ÷ computed positions: the share of the decoder's work spent on padding (0 when
    nothing was computed)."""
    return (computed - real) / computed if computed else 0.0


def padding_fraction(batches: Sequence[MicroBatch]) -> float:
    """`padded_share` of `batches`' positions."""
    return padded_share(*positions(batches))
