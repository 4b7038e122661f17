"""A run's recorded steps (learner/step_record.py): what a step consumed reads back exactly as it
was trained, in order, and records written from several runs' threads at once stay whole lines."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from learner.data import Completion, Group
from learner.step_record import read_steps, record_step


def _groups(n: int) -> list[Group]:
    single = Completion([1, 2], [3, 4, 5], [-0.5, -1.25, -2.0])
    turns = Completion([1], [6, 7, 8], [-0.1, 0.0, -0.3], loss_mask=[1, 0, 1])
    return [Group([single, turns], [float(n), 0.5])]


def test_a_recorded_step_reads_back_as_it_was_trained(tmp_path: Path) -> None:
    batches = [uuid.uuid4(), uuid.uuid4()]
    record_step(tmp_path, "run", step=1, version=1, batch_ids=batches, groups=_groups(1))
    record_step(tmp_path, "run", step=2, version=2, batch_ids=batches[:1], groups=_groups(2))
    steps = read_steps(tmp_path / "run.jsonl")
    assert [(s.step, s.version) for s in steps] == [(1, 1), (2, 2)]
    assert steps[0].batch_ids == [str(b) for b in batches]
    assert steps[1].groups == _groups(2)  # token ids, log-probs, masks and rewards exactly


def test_records_from_many_threads_stay_whole(tmp_path: Path) -> None:
    def write(n: int) -> None:
        for step in range(20):
            record_step(tmp_path, "run", step=step, version=n, batch_ids=[], groups=_groups(n))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    steps = read_steps(tmp_path / "run.jsonl")
    expected = [(n, k) for n in range(4) for k in range(20)]
    assert sorted((s.version, s.step) for s in steps) == expected
