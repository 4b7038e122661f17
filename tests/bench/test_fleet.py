"""bench/fleet.py's utilisation arithmetic (the benchmark itself needs a server and Postgres)."""

from __future__ import annotations

import pytest

from bench.common import Window, union_overlap
from bench.fleet import Stats


def test_union_counts_overlapping_leases_once_and_clips_to_the_window() -> None:
    window = Window(10.0, 20.0)
    # two slots overlapping (9-13 and 12-15), a gap, one running past the end (18-25)
    assert union_overlap([(12.0, 15.0), (9.0, 13.0), (18.0, 25.0)], window) == pytest.approx(7.0)
    assert union_overlap([], window) == 0.0
    assert union_overlap([(0.0, 5.0), (21.0, 30.0)], window) == 0.0


def test_fleet_utilisation_is_the_mean_over_workers() -> None:
    stats = Stats(Window(0.0, 10.0))
    stats.busy = [[(0.0, 10.0)], [(0.0, 5.0)]]
    assert stats.utilisation() == pytest.approx(0.75)
