"""The per-step trajectory figures: a score computed on a worker is counted (`worker_scored`),
so a run's metrics say where its scores came from."""

from __future__ import annotations

import dataclasses

from learner.trajectory_metrics import trajectory_metrics
from protocol.batch_reader import TrajectoryRecord
from tests.protocol import trajectory_factory as tf


def _records() -> list[TrajectoryRecord]:
    return [
        TrajectoryRecord(
            prompt_row_id=s.prompt_row_id,
            group_index=s.group_index,
            token_ids=s.trajectory.token_ids,
            loss_mask=s.trajectory.loss_mask,
            logprobs=s.trajectory.logprobs,
            spans=list(s.trajectory.spans),
            messages=list(s.trajectory.messages),
            stop_reason=s.trajectory.stop_reason,
            info=dict(s.trajectory.info),
        )
        for s in tf.make_samples(seed=3)
    ]


def test_worker_scored_counts_trajectories_with_a_worker_score() -> None:
    records = _records()
    assert len(records) >= 2
    assert trajectory_metrics(records)["worker_scored"] == 0
    records[0] = dataclasses.replace(records[0], info={"worker_score": 0.5})
    records[1] = dataclasses.replace(records[1], info={"secret": 7})
    assert trajectory_metrics(records)["worker_scored"] == 1
    assert trajectory_metrics([]) == {}
