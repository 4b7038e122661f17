"""`asyncgrpo demo`: the embedded server, N rollout workers and the learner on this machine's
CPU with the small model and the `arithmetic` task (asyncgrpo/live_run.py runs and watches it)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console

from asyncgrpo.cluster import ClusterConfig
from asyncgrpo.live_run import QUICK_STOP_WORKER_ENV, LivePlan, run_live

WORKER_PRICE_PER_HOUR = "0.50"  # a simulated spot price, so the spend figures move


def demo_config(versions: int, seed: int = 0) -> dict[str, Any]:
    """The bundled arithmetic run, ending after `versions` adapter versions; `seed` picks the
    prompts and the learner's seed."""
    text = resources.files("asyncgrpo").joinpath("demo_run.json").read_text()
    config: dict[str, Any] = json.loads(text)
    config["max_versions"] = versions
    per_epoch = versions * config["prompts_per_step"]
    config["dataset"]["size"] = per_epoch  # one epoch of exactly `versions` steps
    config["dataset"]["seed"] = seed
    config["seed"] = seed
    return config


def run_demo(
    *,
    workers: int,
    port: int | None,
    versions: int,
    work_dir: Path,
    console: Console,
    seed: int = 0,
) -> int:
    """Run the demo to the end (or Ctrl-C); returns the exit code."""
    worker_env = {"ASYNCGRPO_WORKER_PRICE_PER_HOUR": WORKER_PRICE_PER_HOUR, **QUICK_STOP_WORKER_ENV}
    plan = LivePlan(
        title="asyncgrpo demo",
        run_config=demo_config(versions, seed),
        cluster=ClusterConfig(work_dir=work_dir, port=port, worker_env=worker_env),
        workers=workers,
        worker_prefix="demo-worker",
        where="CPU",
    )
    return run_live(plan, console)
