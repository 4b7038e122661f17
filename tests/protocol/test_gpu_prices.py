"""The one table of GPU prices and speeds (protocol/gpu_prices.py): every figure has a source and
a date; the cost page's defaults and the planner's examples are the table's; and every price or
speed the README and the guides quote for a GPU in the table is the table's figure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from protocol.gpu_prices import BY_NAME, GPUS, LEARNER_EXAMPLE, WORKER_EXAMPLES, Sourced
from server.config import DashboardSettings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
NAMES = "|".join(sorted((re.escape(g.name) for g in GPUS), key=len, reverse=True))
OFFER = re.compile(rf"\b({NAMES}):(\d+(?:\.\d+)?)(?::(\d+(?:\.\d+)?))?\b")
WORKER = re.compile(
    r"(?:--gpu-type |GPU_TYPE=)(\S+).*?(?:--price-per-hour |PRICE_PER_HOUR=)([\d.]+)"
)


def _figures() -> list[tuple[str, Sourced]]:
    return [
        (f"{gpu.name}.{field}", figure)
        for gpu in GPUS
        for field in ("on_demand_usd", "offer_usd", "generation_tokens_s", "learner_tokens_s")
        if (figure := getattr(gpu, field)) is not None
    ]


@pytest.mark.parametrize(("name", "figure"), _figures(), ids=[n for n, _ in _figures()])
def test_every_figure_has_a_source_and_a_date(name: str, figure: Sourced) -> None:
    assert figure.value > 0 and len(figure.source) > 20, name
    assert re.fullmatch(r"20\d\d-\d\d(-\d\d)?", figure.date), name


def test_the_cost_page_and_the_planner_start_from_the_table() -> None:
    defaults = DashboardSettings().on_demand_prices
    assert defaults == {g.name: g.on_demand_usd.value for g in GPUS}
    for offer in (LEARNER_EXAMPLE, *WORKER_EXAMPLES):
        name, price, speed = offer.split(":")
        gpu = BY_NAME[name]
        assert gpu.offer_usd is not None and float(price) == gpu.offer_usd.value
        speeds = {s.value for s in (gpu.generation_tokens_s, gpu.learner_tokens_s) if s}
        assert float(speed) in speeds


def _quoted(text: str) -> list[tuple[str, float, float | None]]:
    """(GPU, price, tokens/s or None) of every offer and every worker price the text quotes."""
    joined = text.replace("\\\n", " ")
    found = [(m[1], float(m[2]), float(m[3]) if m[3] else None) for m in OFFER.finditer(joined)]
    for line in joined.splitlines():
        found += [(m[1], float(m[2]), None) for m in WORKER.finditer(line) if m[1] in BY_NAME]
    return found


def test_the_pages_quote_the_tables_figures() -> None:
    checked = 0
    for page in PAGES:
        for name, price, speed in _quoted(page.read_text(encoding="utf-8")):
            gpu = BY_NAME[name]
            where = f"{page.relative_to(ROOT)}: {name}:{price:g}"
            assert gpu.offer_usd is not None and price == gpu.offer_usd.value, where
            if speed is not None:
                speeds = {s.value for s in (gpu.generation_tokens_s, gpu.learner_tokens_s) if s}
                assert speed in speeds, where
            checked += 1
    assert checked >= 5  # README's and real-run's H100 worker, the planner's offers


def test_quoting_a_figure_off_the_table_is_found() -> None:
    assert _quoted("asyncgrpo plan --learner-gpu H100:9:4800") == [("H100", 9.0, 4800.0)]
    assert _quoted("asyncgrpo worker --gpu-type L4 --price-per-hour 0.5") == [("L4", 0.5, None)]
