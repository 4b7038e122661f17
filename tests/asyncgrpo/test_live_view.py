"""The summary of a run on this machine (`asyncgrpo demo`, `asyncgrpo local`), from API-shaped
data (no processes, no model): the reward sparkline on a fixed 0..1 scale, the first-3 / last-3
means, where the final adapter is and the workers by derived state."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from asyncgrpo.demo import demo_config
from asyncgrpo.live_view import (
    FinalAdapter,
    Snapshot,
    edge_means,
    final_adapter_lines,
    sparkline,
    summary_table,
)


def test_sparkline_uses_a_fixed_zero_to_one_scale() -> None:
    assert sparkline([0.0, 1.0, 0.5, -0.2, 1.7]) == "▁█▅▁█"
    assert sparkline([0.25, 0.25]) == "▃▃"  # flat and low stays low (not rescaled to fill)


def test_edge_means_compare_the_first_and_last_three_versions() -> None:
    rewards = {v: v / 10 for v in range(1, 9)}
    assert edge_means(rewards) == pytest.approx((0.2, 0.7))
    assert edge_means({1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 5: 0.5}) is None


def _snapshot(rewards: dict[int, float]) -> Snapshot:
    points = [{"version": v, "values": {"reward_mean": r}} for v, r in rewards.items()]
    proxy = {"samples_generated": 768, "batches_accepted": 48, "rejected_by_reason": {},
             "samples_aborted": 0, "stale_waste": 0.0}  # fmt: skip
    run = {"status": "completed", "current_version": max(rewards),
           "stats": {"spend": {"total_usd": 0.01}}}  # fmt: skip
    workers = [{"status": "active", "state": "online"}, {"status": "active", "state": "offline"},
               {"status": "active", "state": "offline"}]  # fmt: skip
    return Snapshot(run=run, metrics={"learner": points, "proxy": proxy}, workers=workers)


def _render(table: Any) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_summary_shows_learning_time_and_the_final_adapter() -> None:
    rewards = {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.5, 5: 0.6, 6: 0.9}
    final = FinalAdapter(6, "/d/bucket/runs/r/adapters/v000006/",
                         "http://127.0.0.1:9/api/v1/runs/r/adapters/final")  # fmt: skip
    text = _render(summary_table(_snapshot(rewards), demo_config(6), 312.4))
    assert sparkline(list(rewards.values())) in text
    assert "0.200 → 0.667 (+0.467)" in text
    assert "312 s" in text
    assert "1 online, 2 offline" in text
    where = "\n".join(final_adapter_lines(final))
    assert "/d/bucket/runs/r/adapters/v000006/" in where
    assert "http://127.0.0.1:9/api/v1/runs/r/adapters/final" in where
    assert final_adapter_lines(None) == ["no final adapter (the run did not complete)"]


@pytest.mark.parametrize(
    ("best", "shown"),
    [
        ({"best_version": 4, "best_value": 0.59375}, "v4 (eval_accuracy 0.5938)"),
        ({"best_version": 0, "best_value": 0.25}, "v0 (eval_accuracy 0.25) — the base model"),
        ({"best_version": None, "best_value": None}, "none ranked yet (eval_accuracy)"),
    ],
)
def test_the_summary_names_the_best_version(best: dict[str, Any], shown: str) -> None:
    snap = _snapshot({1: 0.1, 2: 0.2})
    snap.run.update(best, best_metric="eval_accuracy")
    text = _render(summary_table(snap, demo_config(2), 10.0))
    assert "best version" in text and shown in text
