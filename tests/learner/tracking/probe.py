"""A learner-like process that mirrors three steps and one evaluated version through the real
Tracker, as `asyncgrpo learner` does, and exits:

    python -m tests.learner.tracking.probe RUN_CONFIG.json RUN_ID --token agr_lrn_…

The backend and its names come from the run config's `tracking` block and the
ASYNCGRPO_LEARNER_TRACKING_* variables; `--token` is on the command line only so that a test
can check it never reaches the tracker. With trackio, the last line printed is what trackio's
own storage reads back (its folder, TRACKIO_DIR, is fixed when trackio is imported)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from learner.config import LearnerSettings
from learner.tracking import Tracker
from protocol.run_config import RunConfig

STEPS = [
    {"loss": 0.5, "reward_mean": 0.25, "tokens_per_s": 100.0},
    {"loss": 0.25, "reward_mean": 0.5, "tokens_per_s": 110.0, "nan_metric": float("nan")},
    {"loss": 0.125, "reward_mean": 0.75, "tokens_per_s": 120.0},
]
EVAL = {"n_prompts": 2, "n_samples": 4, "mean_reward": 0.75, "accuracy": 0.75, "pass_at_n": 1.0}


def main(config_path: str, run_id: str, token: str) -> None:
    logging.basicConfig(level=logging.INFO)
    config = RunConfig.model_validate_json(Path(config_path).read_text())
    settings = LearnerSettings(server_url="http://127.0.0.1:9", run_id=run_id, token=token)
    tracker = Tracker(settings)
    tracker.start(run_id, config)
    for i, values in enumerate(STEPS, start=1):
        tracker.log_step(i, i, values)
    tracker.log_eval(1, EVAL)
    tracker.close(60.0)
    if tracker.failed:
        raise SystemExit(f"tracker failed: {tracker.failed}")
    assert tracker.spec is not None
    if tracker.spec.backend == "trackio":
        from trackio.sqlite_storage import SQLiteStorage

        spec = tracker.spec
        logs = SQLiteStorage.get_logs(spec.project, spec.run_name)
        run_config = SQLiteStorage.get_run_config(spec.project, spec.run_name)
        print(json.dumps({"logs": logs, "config": run_config}, default=str))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], args[args.index("--token") + 1])
