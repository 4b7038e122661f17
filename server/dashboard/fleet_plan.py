"""Learner memory, fleet size and cost per accepted sample (pure arithmetic, no I/O).

Memory of one learner GPU: protocol/learner_memory.py (its formulas, one home with the pool
learners' take), per layout: single, single+ckpt, fsdp, fsdp+ckpt.

Fleet: a worker generates W completion tokens/s at full occupancy (S sequences in flight); the
learner trains R completion tokens/s (the figure the learner reports as `tokens_per_s`, prompt
tokens are in its cost but not counted). With c completion tokens per sample and a fraction a of
generated samples accepted (not stale, not dropped):
  learner demand  = R / c samples/s,   one worker = a · W / c accepted samples/s,
  workers needed  = ceil(demand / one worker),
  workers usable  = max(1, floor(B · G / S)) for an admission bound of B groups of G samples: more
                    workers than the bound can keep full only share the same groups,
  workers         = min(needed, usable); accepted samples/h = 3600 · min(demand, workers · one),
  cost / 1,000 accepted = (workers · worker $/h + N · learner $/h per GPU) / accepted per h · 1000.

A sweep of K runs (docs/guides/sweeps.md, "What a sweep costs"):
- one learner per run: K learners of N GPUs and K times each offer's workers, so K times its
  $/h and its accepted samples/h; given S accepted samples per run, each run takes
  S / (accepted per h of one run) hours and the sweep K times that run's cost.
- how many runs one learner could hold by memory (runs of one base model share its weights,
  and a learner that trains them in turn one micro-batch's activations and logits): per layout,
  floor((GPU memory − (total − LoRA state)) / LoRA state), each run adding its own fp32 LoRA
  state; unknown without the learner GPU's memory.
- how many it keeps up with by tokens/s: one run's workers deliver at most usable · a · W
  accepted completion tokens/s (its admission bound caps the workers it can keep full); the
  learner trains R, so R / (usable · a · W) runs (below 1: one run alone can feed it more than
  it trains).
- runs per learner GPU, the `--max-runs` a pool learner is suggested
  (docs/guides/pool-learners.md): min(runs by memory in the single-GPU layout, single or
  single+ckpt as the runs checkpoint, max(1, floor(runs by tokens/s))), at most K and
  MAX_POOL_RUNS; unknown without the GPU's memory or with more than one learner GPU (a pool
  learner runs on one GPU, never under torchrun), 0 when not even one run fits.
- with pool learners each holding that many runs (k): ceil(K / k) learner GPUs instead of K,
  the workers unchanged. A pool learner keeps up with its k runs (k ≤ runs by tokens/s), so each
  run keeps its accepted samples/h and its hours; the sweep costs
  (ceil(K / k) · learner $/h + K · workers · worker $/h) · hours.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from protocol.learner_memory import TARGETS, Memory, ModelShape, learner_memory, lora_parameters
from protocol.schemas_learner import MAX_POOL_RUNS

# Memory of one GPU of each type, GB (vendor figures), for the "fits" column.
GPU_MEMORY_GB: dict[str, float] = {
    "T4": 16,
    "L4": 24,
    "A10G": 24,
    "L40S": 48,
    "A100": 40,
    "A100-80GB": 80,
    "H100": 80,
    "H200": 141,
}


# What the planner accepts (a wider value is a typo, and would overflow the arithmetic).
MAX_PRICE_PER_HOUR = 10_000.0
TOKENS_PER_S = (0.001, 1e9)
LIMITS: dict[str, tuple[float, float]] = {
    "completion_tokens": (1, 1_000_000),
    "group_size": (1, 4096),
    "bound_groups": (1, 10_000_000),
    "worker_sequences": (1, 1_000_000),
    "learner_gpus": (1, 4096),
    "micro_batch_tokens": (1, 100_000_000),
    "accept_fraction": (0.001, 1),
    "runs": (1, 10_000),
    "samples_per_run": (1, 1e12),
}


def _limit(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


def shown(value: object) -> str:
    """A value for an error message, however long the number typed."""
    text = str(value)
    return text if len(text) <= 20 else text[:17] + "…"


def check_range(name: str, value: float) -> None:
    """ValueError naming `name` unless LIMITS[name] holds finite `value`."""
    low, high = LIMITS[name]
    finite = not isinstance(value, float) or math.isfinite(value)
    if not (finite and low <= value <= high):
        raise ValueError(
            f"{name} must be between {_limit(low)} and {_limit(high)} (got {shown(value)})"
        )


@dataclass(frozen=True)
class Gpu:
    """A GPU offer: type, USD per hour (spot or on demand) and measured or entered tokens/s."""

    name: str
    price_per_hour: float
    tokens_per_s: float

    @classmethod
    def parse(cls, text: str, measured: dict[str, float] | None = None) -> Gpu:
        """`NAME:PRICE:TOKENS_PER_S`, e.g. `L4:0.35:1500`, or `NAME:PRICE` to take the tokens/s
        measured for NAME (case-insensitive) from `measured`; ValueError naming what is wrong."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError(f"GPU {text!r}: expected NAME:PRICE_PER_HOUR:TOKENS_PER_S")
        if len(parts) == 2:
            known = {k.lower(): v for k, v in (measured or {}).items()}
            if parts[0].lower() not in known:
                raise ValueError(
                    f"GPU {text!r}: no tokens/s given and none measured for {parts[0]} "
                    "(write NAME:PRICE_PER_HOUR:TOKENS_PER_S)"
                )
            parts.append(str(known[parts[0].lower()]))
        try:
            price, rate = float(parts[1]), float(parts[2])
        except ValueError:
            raise ValueError(f"GPU {text!r}: price and tokens/s must be numbers") from None
        if not (math.isfinite(price) and 0 <= price <= MAX_PRICE_PER_HOUR):
            raise ValueError(
                f"GPU {shown(text)!r}: price must be between 0 and "
                f"{_limit(MAX_PRICE_PER_HOUR)} USD per hour"
            )
        if not (math.isfinite(rate) and TOKENS_PER_S[0] <= rate <= TOKENS_PER_S[1]):
            low, high = (_limit(x) for x in TOKENS_PER_S)
            raise ValueError(f"GPU {shown(text)!r}: tokens/s must be between {low} and {high}")
        return cls(parts[0], price, rate)


@dataclass(frozen=True)
class FleetInputs:
    completion_tokens: float
    group_size: int
    bound_groups: int
    worker_sequences: int
    accept_fraction: float
    learner_gpus: int

    def check(self) -> None:
        """ValueError naming the first field outside LIMITS."""
        for name in (
            "completion_tokens",
            "group_size",
            "bound_groups",
            "worker_sequences",
            "learner_gpus",
            "accept_fraction",
        ):
            check_range(name, getattr(self, name))


@dataclass(frozen=True)
class FleetRow:
    """One worker GPU offer against the learner."""

    gpu: str
    price_per_hour: float
    workers_needed: int
    workers_usable: int
    workers: int
    bound_limited: bool
    learner_busy: float
    accepted_per_hour: float
    cost_per_hour: float
    cost_per_1000_accepted: float


def fleet_row(worker: Gpu, learner: Gpu, f: FleetInputs) -> FleetRow:
    demand = learner.tokens_per_s / f.completion_tokens
    one = f.accept_fraction * worker.tokens_per_s / f.completion_tokens
    needed = max(1, math.ceil(demand / one - 1e-9))
    usable = max(1, (f.bound_groups * f.group_size) // f.worker_sequences)
    workers = min(needed, usable)
    accepted_s = min(demand, workers * one)
    cost_h = workers * worker.price_per_hour + f.learner_gpus * learner.price_per_hour
    return FleetRow(
        gpu=worker.name,
        price_per_hour=worker.price_per_hour,
        workers_needed=needed,
        workers_usable=usable,
        workers=workers,
        bound_limited=needed > usable,
        learner_busy=accepted_s / demand,
        accepted_per_hour=accepted_s * 3600,
        cost_per_hour=cost_h,
        cost_per_1000_accepted=cost_h / (accepted_s * 3600) * 1000,
    )


@dataclass(frozen=True)
class SweepRow:
    """One worker GPU offer for a sweep of `runs` runs, one learner each."""

    gpu: str
    runs: int
    learner_gpus: int
    workers: int
    cost_per_hour: float
    accepted_per_hour: float
    hours: float | None  # to train samples_per_run accepted samples per run
    cost: float | None
    run_tokens_per_s: float  # the most accepted completion tokens/s one run's workers deliver
    runs_by_tokens: float  # runs one learner keeps up with: R / run_tokens_per_s
    # pool learners (module docstring): None where unknown, 0 runs when not even one fits
    runs_per_learner: int | None  # the suggested --max-runs
    pool_learner_gpus: int | None
    pool_cost_per_hour: float | None
    pool_cost: float | None


@dataclass(frozen=True)
class SweepPlan:
    runs: int
    samples_per_run: float | None
    lora_state_gb: float  # added by each run a learner holds
    runs_by_memory: dict[str, int] | None  # per layout; None without the GPU's memory
    pool_layout: str  # the layout a pool learner's runs are held in: single or single+ckpt
    rows: list[SweepRow]


def sweep_plan(
    runs: int,
    samples_per_run: float | None,
    memory: dict[str, Memory],
    gpu_memory_gb: float | None,
    learner: Gpu | None,
    workers: list[Gpu],
    rows: list[FleetRow],
    f: FleetInputs,
    checkpointing: bool = False,
) -> SweepPlan:
    """A sweep's cost with one learner per run and with pool learners, and the runs one learner
    could hold (module docstring)."""
    check_range("runs", runs)
    if samples_per_run is not None:
        check_range("samples_per_run", samples_per_run)
    lora_gb = next(iter(memory.values())).lora_state
    held = None
    if gpu_memory_gb is not None:
        held = {
            layout: max(0, math.floor((gpu_memory_gb - (m.total - m.lora_state)) / m.lora_state))
            for layout, m in memory.items()
        }
    layout = "single+ckpt" if checkpointing else "single"
    by_memory = held[layout] if held is not None and f.learner_gpus == 1 else None
    out: list[SweepRow] = []
    for worker, row in zip(workers, rows, strict=True):
        assert learner is not None
        out.append(_sweep_row(runs, samples_per_run, by_memory, learner, worker, row, f))
    return SweepPlan(runs, samples_per_run, lora_gb, held, layout, out)


def runs_per_learner(runs: int, by_memory: int | None, by_tokens: float) -> int | None:
    """The runs one pool learner GPU holds (module docstring); None without a memory figure."""
    if by_memory is None:
        return None
    return min(by_memory, max(1, math.floor(by_tokens + 1e-9)), runs, MAX_POOL_RUNS)


def _sweep_row(
    runs: int,
    samples_per_run: float | None,
    by_memory: int | None,
    learner: Gpu,
    worker: Gpu,
    row: FleetRow,
    f: FleetInputs,
) -> SweepRow:
    run_rate = row.workers_usable * f.accept_fraction * worker.tokens_per_s
    hours = None if samples_per_run is None else samples_per_run / row.accepted_per_hour
    by_tokens = learner.tokens_per_s / run_rate
    per = runs_per_learner(runs, by_memory, by_tokens)
    pool_gpus = math.ceil(runs / per) if per else None
    pool_h = None
    if pool_gpus is not None:
        pool_h = pool_gpus * learner.price_per_hour + runs * row.workers * worker.price_per_hour
    return SweepRow(
        gpu=row.gpu,
        runs=runs,
        learner_gpus=runs * f.learner_gpus,
        workers=runs * row.workers,
        cost_per_hour=runs * row.cost_per_hour,
        accepted_per_hour=runs * row.accepted_per_hour,
        hours=hours,
        cost=None if hours is None else runs * row.cost_per_hour * hours,
        run_tokens_per_s=run_rate,
        runs_by_tokens=by_tokens,
        runs_per_learner=per,
        pool_learner_gpus=pool_gpus,
        pool_cost_per_hour=pool_h,
        pool_cost=None if pool_h is None or hours is None else pool_h * hours,
    )


@dataclass(frozen=True)
class FullPlan:
    model: str
    rank: int
    targets: str
    learner_gpus: int
    micro_batch_tokens: int
    memory: dict[str, Memory]  # "single", "single+ckpt", "fsdp", "fsdp+ckpt"
    learner_gpu_memory_gb: float | None
    fleet: list[FleetRow]
    sweep: SweepPlan

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def full_plan(
    shape: ModelShape,
    rank: int,
    targets: str,
    *,
    micro_batch_tokens: int,
    learner: Gpu | None,
    workers: list[Gpu],
    fleet: FleetInputs,
    runs: int = 1,
    samples_per_run: float | None = None,
    checkpointing: bool = False,
) -> FullPlan:
    """Memory of every layout and, given a learner and worker offers, one fleet row each; and
    a sweep of `runs` runs (sweep_plan; `checkpointing`: the runs' gradient checkpointing, which
    picks the pool learners' layout)."""
    check_range("micro_batch_tokens", micro_batch_tokens)
    if targets not in TARGETS:
        raise ValueError(f"unknown target set {targets!r}")
    fleet.check()
    lora = lora_parameters(shape, rank, TARGETS[targets])
    memory = {
        f"{'fsdp' if fsdp else 'single'}{'+ckpt' if ckpt else ''}": learner_memory(
            shape, lora, micro_batch_tokens, gpus=fleet.learner_gpus, fsdp=fsdp, checkpointing=ckpt
        )
        for fsdp in (False, True)
        for ckpt in (False, True)
    }
    if workers and learner is None:
        raise ValueError("worker GPUs need a learner GPU (its price and tokens/s)")
    rows = [fleet_row(w, learner, fleet) for w in workers] if learner is not None else []
    gpu_gb = GPU_MEMORY_GB.get(learner.name.upper()) if learner else None
    sweep = sweep_plan(
        runs, samples_per_run, memory, gpu_gb, learner, workers, rows, fleet, checkpointing
    )
    return FullPlan(
        model=shape.name,
        rank=rank,
        targets=targets,
        learner_gpus=fleet.learner_gpus,
        micro_batch_tokens=micro_batch_tokens,
        memory=memory,
        learner_gpu_memory_gb=gpu_gb,
        fleet=rows,
        sweep=sweep,
    )
