"""The three trackers for real, offline: a process mirrors three steps and one evaluated
version through the learner's Tracker (tests/learner/tracking/probe.py), and the test reads
back what the tracker stored (W&B's offline run file, trackio's local SQLite store, an MLflow
file store) — values, steps, the run config with its webhook redacted, and no secret (the
webhook's, the learner token on the command line) anywhere in the tracker's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.learner.tracking.support import (
    RUN_ID,
    WEBHOOK,
    assert_no_secret,
    grep,
    run_probe,
    secret_config,
)
from tests.learner.tracking.wandb_records import read_run

# integration: each tracker backend in a probe subprocess
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
LOSSES = [0.5, 0.25, 0.125]


def test_wandb_offline_run_holds_the_steps_the_eval_and_the_redacted_config(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "wandb"
    config = secret_config(backend="wandb", project="probe", tags=["ci"])
    run_probe(tmp_path, config, {"WANDB_MODE": "offline", "WANDB_DIR": str(folder)})
    assert grep(tmp_path, WEBHOOK)  # the search below can find it: the probe's config has it

    run = read_run(folder)
    assert [d.name for d in (folder / "wandb").glob("offline-run-*")][0].endswith(RUN_ID)
    train = [r for r in run["history"] if "train/step" in r]
    assert [r["train/step"] for r in train] == [1, 2, 3]
    assert [r["train/loss"] for r in train] == LOSSES
    assert [r["train/version"] for r in train] == [1, 2, 3]
    assert all("train/nan_metric" not in r for r in train)  # NaN is not mirrored
    (ev,) = [r for r in run["history"] if "eval/version" in r]
    assert (ev["eval/version"], ev["eval/accuracy"], ev["eval/pass_at_n"]) == (1, 0.75, 1.0)
    assert run["config"]["alarms"]["webhook_url"] == "[redacted]"
    assert run["config"]["grpo"]["learning_rate"] == config["grpo"]["learning_rate"]
    assert assert_no_secret(folder) >= 1


def test_trackio_local_store_holds_the_steps_the_eval_and_the_redacted_config(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "trackio"
    config = secret_config(backend="trackio", project="probe", run_name="probe-run")
    out = run_probe(tmp_path, config, {"TRACKIO_DIR": str(folder)})
    back = json.loads(out.strip().splitlines()[-1])

    train = [r for r in back["logs"] if "train/loss" in r]
    assert [(r["step"], r["train/loss"]) for r in train] == list(
        zip([1, 2, 3], LOSSES, strict=True)
    )
    assert [r["train/reward_mean"] for r in train] == [0.25, 0.5, 0.75]
    (ev,) = [r for r in back["logs"] if "eval/accuracy" in r]
    assert (ev["step"], ev["eval/accuracy"], ev["eval/mean_reward"]) == (1, 0.75, 0.75)
    assert back["config"]["alarms"]["webhook_url"] == "[redacted]"
    assert back["config"]["asyncgrpo_run_id"] == RUN_ID
    assert assert_no_secret(folder) >= 1


def test_mlflow_file_store_holds_the_steps_and_a_restart_continues_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    config = secret_config(backend="mlflow", project="from-the-run-config")
    env = {
        "ASYNCGRPO_LEARNER_TRACKING_URI": f"file://{store}",
        "ASYNCGRPO_LEARNER_TRACKING_PROJECT": "from-the-flag",  # wins over the run config's
        "MLFLOW_ALLOW_FILE_STORE": "true",
    }
    run_probe(tmp_path, config, env)
    run_probe(tmp_path, config, env)  # a restarted learner: the same MLflow run, found by tag

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file://{store}")
    assert client.get_experiment_by_name("from-the-run-config") is None
    experiment = client.get_experiment_by_name("from-the-flag")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["asyncgrpo.run_id"] == RUN_ID
    assert run.info.run_name == f"{config['name']}-{RUN_ID[:8]}"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == sorted(
        2 * list(zip([1, 2, 3], LOSSES, strict=True))
    )
    accuracy = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert [(m.step, m.value) for m in accuracy] == [(1, 0.75), (1, 0.75)]
    params = run.data.params
    assert params["alarms.webhook_url"] == "[redacted]"
    assert float(params["grpo.learning_rate"]) == config["grpo"]["learning_rate"]
    assert run.info.status == "FINISHED"
    assert assert_no_secret(store) >= 1
