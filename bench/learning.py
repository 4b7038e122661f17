"""Evidence that the whole system learns: the embedded control plane, rollout workers and the
learner (asyncgrpo/cluster.py, as `asyncgrpo demo` and the e2e suite use it) on CPU with the
small model and the built-in `arithmetic` task, for >= 30 adapter versions.

    nice .venv/bin/python -m bench.learning [--versions 32] [--workers 1] [--work-dir DIR] [--json]

Setup as in facts.md: LoRA r=16 on q,k,v,o, lr 5e-4, 8 prompts x 8 completions per step, 32 new
tokens, temperature 1.0. Progress (one line per poll with a new version) goes to stdout and to
DIR/progress.log; at the end (or on Ctrl-C / SIGTERM, with what was reached) it prints the mean
reward of the batches trained into each version and the first-5 vs last-5 figures. Not CI.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncgrpo.cluster import Cluster, ClusterConfig  # noqa: E402
from asyncgrpo.demo import STOPPED, Snapshot, poll  # noqa: E402
from bench import report  # noqa: E402

TARGET_GAIN = 0.3


def learning_config(versions: int, seed: int) -> dict[str, Any]:
    prompts_per_step = 8
    return {
        "name": "bench-learning-arithmetic",
        "base_model": "smollm2-135m-instruct",
        "dataset": {
            "kind": "generator",
            "generator": "arithmetic",
            "size": versions * prompts_per_step,
            "seed": seed,
        },
        "rewards": [{"name": "numeric_match", "weight": 1.0, "kwargs": {}}],
        "lora": {
            "rank": 16,
            "alpha": 32.0,
            "dropout": 0.0,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        },
        "grpo": {"learning_rate": 5e-4, "system_prompt": "You are a helpful assistant."},
        "sampling": {"temperature": 1.0, "max_new_tokens": 32},
        "group_size": 8,
        "prompts_per_lease": 2,
        "prompts_per_step": prompts_per_step,
        "weight_sync_steps": 1,
        "max_staleness": 1,
        "max_attempts": 3,
        "epochs": 1,
        "max_versions": versions,
        "lease_ttl_s": 600.0,
        "heartbeat_interval_s": 10.0,
        "seed": seed,
    }


def first_last(rewards: dict[int, float], n: int = 5) -> tuple[float, float] | None:
    versions = sorted(rewards)
    if len(versions) < 2 * n:
        return None
    first = sum(rewards[v] for v in versions[:n]) / n
    last = sum(rewards[v] for v in versions[-n:]) / n
    return first, last


def print_rewards(rewards: dict[int, float], wall_s: float, out: Any) -> bool:
    """Print the per-version table and the first-5 / last-5 figures; True when the gain holds."""
    print("\nversion  reward_mean", file=out)
    for version, value in sorted(rewards.items()):
        print(f"{version:7d}  {value:.3f}", file=out)
    print(
        f"versions with a reward figure: {len(rewards)}; wall time {wall_s / 60:.1f} min", file=out
    )
    figures = first_last(rewards)
    if figures is None:
        print("fewer than 10 versions: no first-5 / last-5 comparison", file=out)
        return False
    first, last = figures
    ok = last - first >= TARGET_GAIN
    print(
        f"first 5 versions: {first:.3f}  last 5 versions: {last:.3f}  "
        f"gain {last - first:+.3f} (target >= {TARGET_GAIN}: {'met' if ok else 'NOT met'})",
        file=out,
    )
    return ok


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def watch(cluster: Cluster, log: Any, timeout_s: float) -> Snapshot | None:
    started = time.monotonic()
    snap: Snapshot | None = None
    seen = -1
    while time.monotonic() - started < timeout_s:
        time.sleep(5.0)
        try:
            snap = poll(cluster)
        except Exception as exc:  # noqa: BLE001 - a poll during load may time out; keep going
            print(f"poll failed: {exc}", file=log, flush=True)
            continue
        version = int(snap.run["current_version"])
        if version != seen:
            seen = version
            rewards = snap.reward_by_version()
            last = f"{rewards[max(rewards)]:.3f}" if rewards else "-"
            line = (
                f"{time.strftime('%H:%M:%S')} +{(time.monotonic() - started) / 60:5.1f} min "
                f"version {version} status {snap.status} last reward_mean {last}"
            )
            print(line, flush=True)
            print(line, file=log, flush=True)
        if snap.status in STOPPED:
            return snap
        learner = cluster.learner
        if learner is not None and not learner.alive():
            print(f"learner exited ({learner.returncode()})", file=log, flush=True)
            return snap
    return snap


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--versions", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-min", type=float, default=90.0)
    parser.add_argument("--work-dir", type=Path, default=None)
    report.add_json_flag(parser)
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    config = learning_config(args.versions, args.seed)
    (work / "run.json").write_text(json.dumps(config, indent=2))
    signal.signal(signal.SIGTERM, _interrupt)
    cluster = Cluster(
        ClusterConfig(
            work_dir=work,
            worker_env={
                "ASYNCGRPO_WORKER_RETRY_MAX_S": "5",
                "ASYNCGRPO_WORKER_ACQUIRE_WAIT_S": "5",
            },
        )
    )
    started = time.monotonic()
    snap: Snapshot | None = None
    with (work / "progress.log").open("a") as log:
        print(f"work dir {work}", flush=True)
        try:
            cluster.start_server()
            cluster.create_run(config, registration_uses=args.workers)
            cluster.start_learner()
            for i in range(args.workers):
                cluster.start_worker(f"learning-worker-{i + 1}")
            snap = watch(cluster, log, args.timeout_min * 60)
        except KeyboardInterrupt:
            print("interrupted: reporting what was reached", file=log, flush=True)
            try:
                snap = poll(cluster)
            except Exception:  # noqa: BLE001
                pass
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            cluster.stop()
        if snap is None:
            print("no snapshot of the run was taken", file=log, flush=True)
            return 1
        rewards = snap.reward_by_version()
        wall = time.monotonic() - started
        ok = print_rewards(rewards, wall, sys.stdout)
        print_rewards(rewards, wall, log)
        first_last_5 = first_last(rewards)
        report.emit(
            args,
            {
                "reward_by_version": {str(v): r for v, r in sorted(rewards.items())},
                "first_5": first_last_5[0] if first_last_5 else None,
                "last_5": first_last_5[1] if first_last_5 else None,
                "target_gain": TARGET_GAIN,
                "gain_met": ok,
                "wall_s": wall,
            },  # fmt: skip
        )
    return 0 if ok and len(rewards) >= 30 else 1


if __name__ == "__main__":
    sys.exit(main())
