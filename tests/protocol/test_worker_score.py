"""The `worker_score` reward: a trusted worker's environment score read from `info`, allowed only
on runs whose environment requires trusted workers."""

from __future__ import annotations

from typing import Any

from protocol import rewards
from protocol.run_config import LearnerRunConfig, RunConfig
from tests.protocol.test_run_config import base, errors_of

VF = "verifiers:tests.worker.environments.vf_standin"


def _run(requires_trusted_worker: bool) -> dict[str, Any]:
    cfg = base()
    cfg["rewards"] = [{"name": "worker_score", "weight": 1.0}]
    cfg["environment"] = {"name": VF, "requires_trusted_worker": requires_trusted_worker}
    return cfg


def test_reads_info_and_skips_what_is_not_a_score() -> None:
    info = [{"worker_score": 0.5}, {}, {"worker_score": "1"}, {"worker_score": float("nan")}, None]
    got = rewards.worker_score(["q"] * 5, ["a"] * 5, info=info)
    assert got == [0.5, None, None, None, None]
    assert rewards.worker_score(["q"], ["a"]) == [None]  # format 1 batches have no info
    learner = LearnerRunConfig.model_validate(RunConfig.model_validate(_run(True)).for_learner())
    combined = rewards.combine(
        learner.rewards,
        ["q", "q"],
        ["a", "b"],
        {"info": [{"worker_score": 1.0}, {"worker_score": 0.0}]},
    )
    assert list(combined.total) == [1.0, 0.0]


def test_refused_unless_the_run_requires_trusted_workers() -> None:
    errors = errors_of(_run(False))
    assert [loc for loc, _m, _t in errors] == ["environment"]
    assert "worker_score" in errors[0][1] and "requires_trusted_worker" in errors[0][1]
    run = RunConfig.model_validate(_run(True))
    assert run.environment.requires_trusted_worker and run.multi_turn
