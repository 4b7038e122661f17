"""docs/reference/gpu-prices.md: the GPU prices and speeds the cost page and the planner start
from, each with its source and date, from their one home (protocol/gpu_prices.py)."""

from __future__ import annotations

from asyncgrpo.docs_reference.markdown import cell, code, page, table
from protocol.gpu_prices import GPUS, LEARNER_EXAMPLE, WORKER_EXAMPLES, Sourced

INTRO = f"""
The figures the cost page and the planner start from, and the ones the README and the guides
quote (an H100 worker at `--price-per-hour 2.5`, the planner's `--learner-gpu
{LEARNER_EXAMPLE}`), each with where it comes from and when. They are defaults and examples:
prices move, and a run's own speeds are measured by `asyncgrpo plan --from-run`
([the planner](../guides/dashboard.md#planning-a-run)). The on-demand column is the cost page's
saving reference, `ASYNCGRPO_DASHBOARD__ON_DEMAND_PRICES` ([settings](settings.md)) replaces it;
the offers are what the planner page fills in (`{WORKER_EXAMPLES[0]}`, `{WORKER_EXAMPLES[1]}`).
The table lives in `protocol/gpu_prices.py`.
"""

HEADERS = (
    "GPU",
    "on-demand USD/h",
    "example offer USD/h",
    "example worker tokens/s",
    "example learner tokens/s",
)


def _figure(figure: Sourced | None, notes: dict[str, int]) -> str:
    """The value with a footnote mark naming its source; — for none."""
    if figure is None:
        return "—"
    key = f"{figure.source} ({figure.date})"
    number = notes.setdefault(key, len(notes) + 1)
    return f"{figure.value:g} [{number}]"


def render() -> str:
    notes: dict[str, int] = {}
    rows = [
        (
            code(gpu.name),
            _figure(gpu.on_demand_usd, notes),
            _figure(gpu.offer_usd, notes),
            _figure(gpu.generation_tokens_s, notes),
            _figure(gpu.learner_tokens_s, notes),
        )
        for gpu in GPUS
    ]
    sources = "\n".join(f"{n}. {cell(source)}" for source, n in notes.items())
    return page(
        "GPU prices and speeds", INTRO, [table(HEADERS, rows), "Sources:\n\n" + sources + "\n"]
    )
