"""Evidence that the whole system learns, measured on held-out prompts: the embedded control
plane, rollout workers and the learner (asyncgrpo/cluster.py, as `asyncgrpo demo` and the e2e
suite use it) on CPU with the small model; the run's eval block scores version 0 (the base
model) and the last version greedily on prompts it never trains on.

    nice .venv/bin/python -m bench.learning [--task arithmetic|word_problems] [--versions N]
        [--workers 2] [--seed 0] [--work-dir DIR] [--json]

Tasks:
- `arithmetic` (default, 16 versions): 2-digit additions from the `arithmetic` generator,
  `numeric_match`, 8 prompts x 8 completions per step, 16 new tokens at temperature 1.0, LoRA
  r 16 on every linear layer, lr 1e-3 with a cosine decay to 1e-4 after one warm-up step (the
  demo's settings); eval on 64 held-out additions (another seed, every training question
  removed), greedy, at versions 0, N/4, N/2, 3N/4 and N; the run's best version is ranked by
  that eval accuracy (server/runs/best.py). Goals: the best version's eval accuracy >= version 0
  + 0.3, and the last version within 0.1 of the best (or the run stopped early at the best).
- `word_problems` (12 versions): examples/runs/gsm8k-smollm2-cpu.json as it is (GSM8K-format
  problems the project writes, `math_verify`, eval on 64 test problems every 4 versions);
  reported, no goal.

Progress goes to stdout and DIR/progress.log; at the end (or on Ctrl-C / SIGTERM, with what was
reached) it prints the training reward per version and the eval figures per version. Not CI.
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
from asyncgrpo.demo import demo_config  # noqa: E402
from asyncgrpo.live_run import STOPPED  # noqa: E402
from asyncgrpo.live_view import Snapshot, poll  # noqa: E402
from asyncgrpo.local_config import server_paths  # noqa: E402
from bench import report  # noqa: E402
from protocol import datasets  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET_BEST_GAIN = 0.3  # eval accuracy, the best version over version 0 (arithmetic)
FINAL_WITHIN = 0.1  # eval accuracy the last version may lose to the best one (arithmetic)
EVAL_PROMPTS = 64


def held_out_additions(train_seed: int, n: int = EVAL_PROMPTS) -> list[dict[str, Any]]:
    """`n` additions of another seed that are not among the training questions."""
    train = {r["prompt"] for r in datasets.generate("arithmetic", 1000, train_seed)}
    candidates = datasets.generate("arithmetic", 4 * n, train_seed + 1)
    return [r for r in candidates if r["prompt"] not in train][:n]


def arithmetic_config(versions: int, seed: int) -> dict[str, Any]:
    config = demo_config(versions, seed)
    config["name"] = "bench-learning-arithmetic"
    config["dataset"] = {
        "kind": "generator",
        "generator": "arithmetic",
        "size": versions * config["prompts_per_step"],
        "seed": seed,
    }
    config["seed"] = seed
    config["lease_ttl_s"] = 600.0
    config["eval"] = {
        "dataset": {"kind": "jsonl", "rows": held_out_additions(seed)},
        "every_versions": max(1, versions // 4),
        "n": 1,
        "temperature": 0.0,
        "accuracy_reward": "numeric_match",
        "threshold": 1.0,
    }
    return config


def word_problems_config(versions: int, seed: int) -> dict[str, Any]:
    # the example's data files are relative to the repository root; the server runs elsewhere
    config = server_paths(
        json.loads((ROOT / "examples/runs/gsm8k-smollm2-cpu.json").read_text()), ROOT
    )
    config["name"] = "bench-learning-word-problems"
    config["max_versions"] = versions
    config["seed"] = seed
    config["lease_ttl_s"] = 600.0
    return config


TASKS = {
    "arithmetic": (arithmetic_config, 16),
    "word_problems": (word_problems_config, 12),
}


def first_last(rewards: dict[int, float], n: int = 3) -> tuple[float, float] | None:
    """Mean training reward of the first and of the last `n` versions (None below 2n)."""
    versions = sorted(rewards)
    if len(versions) < 2 * n:
        return None
    first = sum(rewards[v] for v in versions[:n]) / n
    last = sum(rewards[v] for v in versions[-n:]) / n
    return first, last


def print_rewards(rewards: dict[int, float], wall_s: float, out: Any) -> None:
    print("\nversion  training reward_mean", file=out)
    for version, value in sorted(rewards.items()):
        print(f"{version:7d}  {value:.3f}", file=out)
    figures = first_last(rewards)
    if figures is not None:
        print(f"first 3 versions: {figures[0]:.3f}  last 3 versions: {figures[1]:.3f}", file=out)
    print(f"wall time {wall_s / 60:.1f} min", file=out)


def eval_figures(evals: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """Accuracy of version 0, of the last evaluated version and of the run's best version (as
    the server ranked it, server/runs/best.py), and the gains."""
    done = {v["version"]: v for v in evals if v.get("state") == "done"}
    accuracy = {n: v["accuracy"] for n, v in done.items() if v.get("accuracy") is not None}
    base = accuracy.get(0)
    last = max(accuracy) if accuracy else None
    best = run.get("best_version")
    gain = None
    if base is not None and last is not None and last > 0:
        gain = accuracy[last] - base
    best_accuracy = accuracy.get(best) if best is not None else None
    return {
        "eval_accuracy_v0": base,
        "eval_last_version": last,
        "eval_accuracy_last": accuracy.get(last) if last is not None else None,
        "eval_gain": gain,
        "best_version": best,
        "best_metric": run.get("best_metric"),
        "eval_accuracy_best": best_accuracy,
        "best_gain": None if best_accuracy is None or base is None else best_accuracy - base,
        "stopped_early": "early stop" in str(run.get("status_reason") or ""),
    }


def goals_met(figures: dict[str, Any]) -> tuple[bool, str]:
    """The arithmetic goals: the best version >= version 0 + TARGET_BEST_GAIN, and the last
    version within FINAL_WITHIN of the best (or the run stopped early at the best)."""
    best_gain, best, last = (
        figures[k] for k in ("best_gain", "eval_accuracy_best", "eval_accuracy_last")
    )
    if best_gain is None or best is None or last is None:
        return False, "no best version or no final eval"
    kept = figures["stopped_early"] or best - last <= FINAL_WITHIN + 1e-9
    met = best_gain >= TARGET_BEST_GAIN and kept
    why = (
        f"best v{figures['best_version']} {best:.3f} = v0 {best_gain:+.3f} (goal >= "
        f"+{TARGET_BEST_GAIN}); last {last:.3f}, {best - last:.3f} below the best (goal <= "
        f"{FINAL_WITHIN}{' or stopped early' if figures['stopped_early'] else ''})"
    )
    return met, why


def print_evals(evals: list[dict[str, Any]], figures: dict[str, Any], task: str, out: Any) -> None:
    print("\nversion  eval accuracy  pass@n  mean reward  prompts  state", file=out)
    for v in evals:
        acc, pas, mean = (v.get(k) for k in ("accuracy", "pass_at_n", "mean_reward"))
        best = "  (best)" if v["version"] == figures["best_version"] else ""
        print(
            f"{v['version']:7d}  {_f(acc):>13}  {_f(pas):>6}  {_f(mean):>11}  "
            f"{v.get('n_prompts', 0):7d}  {v.get('state')}{best}",
            file=out,
        )
    gain = figures["eval_gain"]
    if gain is None:
        print("no eval gain: version 0 or a later version was not evaluated", file=out)
    elif task == "arithmetic":
        met, why = goals_met(figures)
        print(f"{why}: {'met' if met else 'NOT met'}", file=out)
    else:
        print(f"eval gain {gain:+.3f} (reported; no goal)", file=out)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


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


def _evals(cluster: Cluster) -> list[dict[str, Any]]:
    assert cluster.admin is not None and cluster.run_id is not None
    try:
        return list(cluster.admin.run_evals(cluster.run_id)["versions"])
    except Exception as exc:  # noqa: BLE001 - report what the run reached
        print(f"could not read the eval results: {exc}", flush=True)
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="arithmetic")
    parser.add_argument("--versions", type=int, default=None, help="Default: the task's.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-min", type=float, default=90.0)
    parser.add_argument("--work-dir", type=Path, default=None)
    report.add_json_flag(parser)
    args = parser.parse_args()
    make_config, default_versions = TASKS[args.task]
    versions = args.versions or default_versions
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    config = make_config(versions, args.seed)
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
    evals: list[dict[str, Any]] = []
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
            if snap is not None:
                evals = _evals(cluster)
            cluster.stop()
        if snap is None:
            print("no snapshot of the run was taken", file=log, flush=True)
            return 1
        rewards = snap.reward_by_version()
        wall = time.monotonic() - started
        figures = eval_figures(evals, snap.run)
        for out in (sys.stdout, log):
            print_rewards(rewards, wall, out)
            print_evals(evals, figures, args.task, out)
        edges = first_last(rewards)
        report.emit(
            args,
            {
                "task": args.task,
                "versions": versions,
                "status": snap.status,
                "reward_by_version": {str(v): r for v, r in sorted(rewards.items())},
                "reward_first_3": edges[0] if edges else None,
                "reward_last_3": edges[1] if edges else None,
                "evals": evals,
                **figures,
                "goal_best_gain": TARGET_BEST_GAIN if args.task == "arithmetic" else None,
                "goal_final_within": FINAL_WITHIN if args.task == "arithmetic" else None,
                "goals_met": goals_met(figures)[0] if args.task == "arithmetic" else None,
                "wall_s": wall,
            },  # fmt: skip
        )
    if args.task == "arithmetic":
        return 0 if goals_met(figures)[0] else 1
    return 0 if figures["eval_gain"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
