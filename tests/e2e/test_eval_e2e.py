"""Evaluation during training end to end: the embedded server (SQLite, bucket folder), a real
worker (transformers backend, the small model on CPU) and the real learner, on a tiny run with
an eval block: the run goes evaluating → completed with results for version 0 (the base model)
and the final version."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from asyncgrpo.cluster import Cluster
from tests.conftest import TEST_SECRET
from tests.harness.runs import arithmetic, run_config
from tests.harness.stack import cluster_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _config() -> dict[str, Any]:
    return run_config(
        name="e2e-eval",
        dataset=arithmetic(4),
        lora={"rank": 2, "alpha": 4.0, "target_modules": ["q_proj"]},
        grpo={"spot_check_fraction": 0.0},
        sampling={"temperature": 1.0, "max_new_tokens": 4},
        epochs=1,  # 2 versions
        lease_ttl_s=30.0,
        heartbeat_interval_s=2.0,
        eval={
            "dataset": arithmetic(2, seed=7),
            "every_versions": 5,  # 0, and the final version
            "n": 2,
            "temperature": 1.0,
            "max_new_tokens": 4,
            "accuracy_reward": "numeric_match",
        },
    )


@pytest.mark.timeout(600)
def test_a_tiny_run_is_evaluated_at_version_zero_and_the_final_version(
    tmp_path: Path, small_model_dir: str
) -> None:
    config = cluster_config(
        tmp_path / "cluster",
        secret_key=TEST_SECRET,
        server_env={"ASYNCGRPO_LEASE_LONG_POLL_S": "1"},
        worker_env={
            "ASYNCGRPO_WORKER_ACQUIRE_WAIT_S": "1",
            "ASYNCGRPO_WORKER_IDLE_BACKOFF_MIN_S": "0.2",
            "ASYNCGRPO_WORKER_IDLE_BACKOFF_MAX_S": "1",
        },
        learner_env={"ASYNCGRPO_LEARNER_CLAIM_WAIT_S": "1"},
    )
    with Cluster(config) as cluster:
        cluster.start_server()
        run_id = cluster.create_run(_config())
        cluster.start_learner()
        cluster.start_worker("w1")
        assert cluster.admin is not None
        statuses = set()
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline:
            status = cluster.admin.get_run(run_id)["status"]
            statuses.add(status)
            if status in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.5)
        logs = "\n".join(p.log_text()[-3000:] for p in cluster.processes())
        assert status == "completed", logs
        evals = cluster.admin.run_evals(run_id)
        final = cluster.admin.get_run(run_id)["current_version"]
        learner = cluster.learner
        assert learner is not None
        deadline = time.monotonic() + 60
        while learner.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert learner.returncode() == 0, logs
        learner_log = learner.log_text()
    versions = {v["version"]: v for v in evals["versions"]}
    assert final >= 2 and sorted(versions) == [0, final], evals
    # the learner stayed attached after the final publish, scoring evals until completion
    assert "scoring its evaluation" in learner_log, learner_log[-3000:]
    for v in versions.values():
        assert v["state"] == "done" and v["n_prompts"] == 2 and v["n_samples"] == 4, v
        assert 0.0 <= v["accuracy"] <= 1.0 and 0.0 <= v["pass_at_n"] <= 1.0
        assert v["pass_at_n"] >= v["accuracy"] - 1e-9  # a prompt passes with any accurate sample
        assert v["mean_reward"] is not None
