"""GPU prices and speeds: the one table of them, each figure with its source and the date it was
taken (or entered, when nobody recorded a source). The cost page's on-demand prices
(server/config.py `DEFAULT_ON_DEMAND_PRICES`), the planner's example offers (`asyncgrpo plan
--help`, the planner page's defaults) and the docs (docs/reference/gpu-prices.md, rendered from
here; the README and the guides cite it) read this table and no other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sourced:
    """A figure, where it comes from and when it was taken."""

    value: float
    source: str
    date: str  # ISO date (or month) of the figure


@dataclass(frozen=True)
class Gpu:
    name: str
    on_demand_usd: Sourced  # one GPU for one hour, on demand: the cost page's saving
    offer_usd: Sourced | None = None  # the planner's example price (spot or a GPU cloud)
    generation_tokens_s: Sourced | None = None  # the planner's example worker speed
    learner_tokens_s: Sourced | None = None  # the planner's example learner speed


ON_DEMAND_SOURCE = (
    "entered with the cost page, as on-demand list prices for one GPU; no source was recorded "
    "and they have not been checked since"
)
ON_DEMAND_DATE = "2026-11-29"
OFFER_SOURCE = "an example offer entered with the planner; no source recorded"
OFFER_DATE = "2026-12-01"
SPEED_SOURCE = (
    "an example, not a measurement: no GPU figure of asyncgrpo exists yet "
    "(docs/benchmarks/gpu-check.md); `asyncgrpo plan --from-run` measures a run's own"
)


def _on_demand(usd: float) -> Sourced:
    return Sourced(usd, ON_DEMAND_SOURCE, ON_DEMAND_DATE)


def _speed(tokens_s: float) -> Sourced:
    return Sourced(tokens_s, SPEED_SOURCE, OFFER_DATE)


GPUS: tuple[Gpu, ...] = (
    Gpu("T4", _on_demand(0.53)),
    Gpu(
        "L4",
        _on_demand(0.80),
        offer_usd=Sourced(0.35, OFFER_SOURCE, OFFER_DATE),
        generation_tokens_s=_speed(1500),
    ),
    Gpu(
        "A10G",
        _on_demand(1.21),
        offer_usd=Sourced(0.45, OFFER_SOURCE, OFFER_DATE),
        generation_tokens_s=_speed(1300),
    ),
    Gpu("L40S", _on_demand(1.86)),
    Gpu("A100", _on_demand(3.67)),
    Gpu("A100-80GB", _on_demand(4.10)),
    Gpu(
        "H100",
        _on_demand(6.98),
        offer_usd=Sourced(
            2.50,
            "the low end of H100 SXM prices on specialty GPU clouds ($2.50–3.50/h, May 2026) "
            "in Mercatus' cloud GPU pricing survey, "
            "https://www.mercatus-ai.com/blog/cloud-gpu-pricing (checked 2026-12-07; the "
            "figure was entered on 2026-11-29 without a source)",
            "2026-05",
        ),
        learner_tokens_s=_speed(4800),
    ),
    Gpu("H200", _on_demand(10.60)),
)
BY_NAME = {gpu.name: gpu for gpu in GPUS}


def on_demand_prices() -> dict[str, float]:
    """GPU type → on-demand USD per GPU-hour (the cost page's default table)."""
    return {gpu.name: gpu.on_demand_usd.value for gpu in GPUS}


def _number(value: float) -> str:
    return f"{value:g}"


def offer(name: str, *, learner: bool = False) -> str:
    """`NAME:USD_PER_HOUR:TOKENS_PER_S` of the GPU's example offer, as the planner takes it."""
    gpu = BY_NAME[name]
    speed = gpu.learner_tokens_s if learner else gpu.generation_tokens_s
    assert gpu.offer_usd is not None and speed is not None, f"{name} has no example offer"
    return f"{name}:{_number(gpu.offer_usd.value)}:{_number(speed.value)}"


LEARNER_EXAMPLE = offer("H100", learner=True)
WORKER_EXAMPLES = (offer("L4"), offer("A10G"))
