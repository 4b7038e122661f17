"""K runs on one pool learner against the same K runs trained one after another by per-run
learners: peak memory and aggregate trained tokens/s (issue 31; docs/guides/pool-learners.md,
"What it costs and saves").

    .venv/bin/python bench/learner_pool.py [--runs 1 2 4] [--steps 4] [--prompts 4]
        [--repeats 3] [--json]

Everything is real: the control plane served in this process on SQLite with a folder bucket
(tests/harness/live_app.py), the real small model, `asyncgrpo learner` processes with one torch
thread each. For each K in `--runs`, K runs (rank, alpha, targets and learning rate varied over
RUN_VARIANTS; spot checks off) get `--steps` pre-made real batches each (tests/harness/batches.py
real_batch: `--prompts` prompts × 2 completions, all of version 0, so max_staleness = steps),
made before any learner starts. Then:

  pool     one pool learner with `--max-runs K` trains all K runs to `completed`;
  per-run  a fresh identical set of K runs, each trained by its own `asyncgrpo learner --run`,
           one after the other.

Window (the same rule for both): from a learner process's start to the moment its last run is
seen `completed` (polled every `--sample-s`); the per-run figure is the sum of its K learners'
windows, so the K model loads count, and the time to stop a finished process counts in neither.
Memory: every `--sample-s` the RSS (/proc statm) of the learner process and all of its
descendants (the reward processes) is summed; a phase's peak is the largest sum. RSS counts a
page shared by a parent and its forked children once per process, in both phases alike.
Trained tokens: the learner metric points' `trained_tokens` (learner/trainer.py), the last
point of each version (a step retrained after a lost lease counts once).

`--json` prints one object last:
  {"runs": {"<K>": {"pool_peak_rss_mb", "single_peak_rss_mb" (the largest per-run learner's),
                    "pool_peak_learner_rss_mb", "single_peak_learner_rss_mb" (the learner
                    process alone, in the sample of its tree's peak; the rest is its reward
                    processes),
                    "memory_ratio" (pool_peak / (single_peak × K)),
                    "pool_tokens_per_s", "per_run_tokens_per_s",
                    "tokens_per_s_ratio" (pool / per-run), "pool_window_s", "per_run_window_s",
                    "pool_tokens", "per_run_tokens", "completed" (runs completed, of
                    2K × repeats), "repeats"}},
   "goal": {"memory_ratio_max": 0.5, "tokens_per_s_ratio_min": 0.9, "at_runs": 4},
   "steps", "prompts", "repeats", "threads", "label", "load"}
Each figure is the median over `--repeats` rounds (each round both phases on fresh runs, every
K in turn), each ratio the median of the rounds' ratios; compare within one run only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # a plain script: the repository root, not bench/, on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # (bench/learner.py shadows learner/)

from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import report  # noqa: E402
from bench.common import CONTENDED, MB, MODEL, exit_on_sigterm, load_average  # noqa: E402

MEMORY_GOAL, SPEED_GOAL, GOAL_AT = 0.5, 0.9, 4
PHASE_TIMEOUT_S = 1800.0
RUN_VARIANTS: list[dict[str, Any]] = [
    {"lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
     "grpo": {"learning_rate": 1e-3, "spot_check_fraction": 0.0}},
    {"lora": {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
     "grpo": {"learning_rate": 3e-3, "spot_check_fraction": 0.0}},
    {"lora": {"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
     "grpo": {"learning_rate": 2e-3, "spot_check_fraction": 0.0}},
    {"lora": {"rank": 6, "alpha": 12, "target_modules": ["q_proj", "k_proj", "v_proj"]},
     "grpo": {"learning_rate": 1.5e-3, "spot_check_fraction": 0.0}},
]  # fmt: skip

stderr = Console(stderr=True)


# -- memory of a process tree ----------------------------------------------------------------


def _children_by_parent() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ')'
        found.setdefault(ppid, []).append(int(entry.name))
    return found


def _rss_bytes(pid: int) -> int:
    try:
        resident = Path(f"/proc/{pid}/statm").read_text().split()[1]
    except (OSError, IndexError):
        return 0
    return int(resident) * os.sysconf("SC_PAGE_SIZE")


def tree_rss(pid: int) -> tuple[int, int]:
    """Bytes resident in `pid` and every process descended from it, and in `pid` alone."""
    children, total, todo = _children_by_parent(), 0, [pid]
    while todo:
        current = todo.pop()
        total += _rss_bytes(current)
        todo += children.get(current, [])
    return total, _rss_bytes(pid)


# -- the runs and their figures ----------------------------------------------------------------


@dataclass
class Measured:
    window_s: float
    peak_rss: int  # the largest sample of the whole tree
    peak_own_rss: int  # the learner process alone, in that sample


def make_runs(live: Any, k: int, args: argparse.Namespace, tok: Any, tmp: Path) -> list[Any]:
    """K runs (RUN_VARIANTS in turn), each with `--steps` real batches of version 0."""
    from tests.harness.batches import real_batch
    from tests.harness.runs import plus_rows
    from tests.server.learner.support import make_run, make_worker

    worker_id, _ = make_worker(live.app)
    handles = []
    for i in range(k):
        handle = make_run(
            live.app,
            name=f"pool-bench-{i}",
            dataset={"kind": "jsonl", "rows": plus_rows(args.prompts * args.steps)},
            prompts_per_lease=args.prompts,
            prompts_per_step=args.prompts,
            max_staleness=args.steps,  # every batch is of version 0
            sampling={"max_new_tokens": 8},
            **RUN_VARIANTS[i % len(RUN_VARIANTS)],
        )
        for _ in range(args.steps):
            real_batch(live.app, handle.id, worker_id, 0, tok, tmp)
        handles.append(handle)
    return handles


def statuses(live: Any, run_ids: list[uuid.UUID]) -> list[str]:
    from server.db import transaction
    from server.models import Run

    with transaction(live.app.state.sessionmaker) as session:
        return [session.get(Run, r).status for r in run_ids]  # type: ignore[union-attr]


def trained_tokens(live: Any, run_ids: list[uuid.UUID]) -> float:
    """Σ `trained_tokens` of each run's last learner metric point per version."""
    from sqlalchemy import select

    from server.db import transaction
    from server.models import MetricPoint

    query = (
        select(MetricPoint.run_id, MetricPoint.version, MetricPoint.values)
        .where(MetricPoint.run_id.in_(run_ids), MetricPoint.source == "learner")
        .order_by(MetricPoint.id)
    )
    with transaction(live.app.state.sessionmaker) as session:
        last = {(r, v): values for r, v, values in session.execute(query)}
    return sum(float(values.get("trained_tokens", 0.0)) for values in last.values())


def watch(proc: Any, done: Callable[[], bool], sample_s: float, log: Path) -> Measured:
    """Sample the process tree's RSS until `done()`; the window from now to then."""
    start, peak = time.monotonic(), (0, 0)
    while not done():
        peak = max(peak, tree_rss(proc.pid))
        if proc.poll() is not None:
            raise RuntimeError(f"the learner exited ({proc.returncode}):\n{_tail(log)}")
        if time.monotonic() - start > PHASE_TIMEOUT_S:
            raise RuntimeError(f"no completion in {PHASE_TIMEOUT_S:.0f} s:\n{_tail(log)}")
        time.sleep(sample_s)
    return Measured(time.monotonic() - start, *peak)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"


def _all_completed(live: Any, run_ids: list[uuid.UUID], on_done: Callable[[int], None]) -> bool:
    got = statuses(live, run_ids)
    failed = [s for s in got if s in ("failed", "cancelled")]
    if failed:
        raise RuntimeError(f"a run ended {failed[0]}: {got}")
    on_done(got.count("completed"))
    return all(s == "completed" for s in got)


# -- the two phases ----------------------------------------------------------------------------


def pool_phase(
    live: Any, runs: list[Any], args: argparse.Namespace, tmp: Path, tick: Callable[[int], None]
) -> Measured:
    """One pool learner, `--max-runs K`, until every run is completed."""
    from tests.conftest import mint_token

    k, name = len(runs), f"pool-{len(runs)}"
    registration = mint_token(live.app, "registration", name=name, max_uses=1)
    proc = live.pool_learner([
        "--registration-token", registration, "--credentials-file", str(tmp / f"{name}.json"),
        "--name", name, "--max-runs", str(k), "--take-retry-s", "0.5",
    ])  # fmt: skip
    ids = [r.id for r in runs]
    try:
        done = lambda: _all_completed(live, ids, tick)  # noqa: E731
        return watch(proc, done, args.sample_s, live.pool_learner_log)
    finally:
        live.started[-1].stop(grace_s=10)


def per_run_phase(
    live: Any, runs: list[Any], args: argparse.Namespace, tick: Callable[[int], None]
) -> list[Measured]:
    """Each run by its own learner, one after the other."""
    measured = []
    for i, run in enumerate(runs):
        proc = live.learner(run)
        try:
            done = lambda: _all_completed(live, [run.id], lambda n: tick(i + n))  # noqa: B023, E731
            measured.append(watch(proc, done, args.sample_s, live.learner_log))
        finally:
            live.started[-1].stop(grace_s=10)
    return measured


def measure_k(
    live: Any, k: int, args: argparse.Namespace, tok: Any, tmp: Path, progress: Progress
) -> dict[str, Any]:
    pool_runs = make_runs(live, k, args, tok, tmp)
    task = progress.add_task(f"K={k} pool learner", total=k)
    pool = pool_phase(live, pool_runs, args, tmp, lambda n: progress.update(task, completed=n))
    own_runs = make_runs(live, k, args, tok, tmp)  # after the pool learner stopped
    task = progress.add_task(f"K={k} per-run learners", total=k)
    own = per_run_phase(live, own_runs, args, lambda n: progress.update(task, completed=n))
    progress.console.log(f"K={k}: pool {pool.window_s:.1f} s, peak {pool.peak_rss / MB:,.0f} "
                         f"MB; per-run learners {sum(m.window_s for m in own):.1f} s, largest "
                         f"peak {max(m.peak_rss for m in own) / MB:,.0f} MB")  # fmt: skip
    pool_ids, own_ids = [r.id for r in pool_runs], [r.id for r in own_runs]
    return figures(
        k, pool, own, trained_tokens(live, pool_ids), trained_tokens(live, own_ids),
        statuses(live, pool_ids + own_ids).count("completed"),
    )  # fmt: skip


def figures(
    k: int, pool: Measured, own: list[Measured], pool_tokens: float, own_tokens: float, done: int
) -> dict[str, Any]:
    single = max(own, key=lambda m: m.peak_rss)
    own_window = sum(m.window_s for m in own)
    pool_speed, own_speed = pool_tokens / pool.window_s, own_tokens / own_window
    return {
        "pool_peak_rss_mb": pool.peak_rss / MB,
        "pool_peak_learner_rss_mb": pool.peak_own_rss / MB,
        "single_peak_rss_mb": single.peak_rss / MB,
        "single_peak_learner_rss_mb": single.peak_own_rss / MB,
        "memory_ratio": pool.peak_rss / (single.peak_rss * k),
        "pool_tokens_per_s": pool_speed,
        "per_run_tokens_per_s": own_speed,
        "tokens_per_s_ratio": pool_speed / own_speed,
        "pool_window_s": pool.window_s,
        "per_run_window_s": own_window,
        "pool_tokens": pool_tokens,
        "per_run_tokens": own_tokens,
        "completed": done,
    }


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds (`completed`: the sum)."""
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    out["completed"] = sum(r["completed"] for r in rounds)
    out["repeats"] = len(rounds)
    return out


# -- output ------------------------------------------------------------------------------------


def print_table(results: dict[int, dict[str, Any]]) -> None:
    table = Table(title="K runs: one pool learner vs K per-run learners, one after the other")
    for header in ("K", "pool peak MB", "of it learner", "largest single MB", "of it learner",
                   "memory ratio", "pool tok/s",
                   "per-run tok/s", "tok/s ratio", "pool s", "per-run s", "completed"):  # fmt: skip
        table.add_column(header, justify="right")
    for k, f in results.items():
        table.add_row(
            str(k), f"{f['pool_peak_rss_mb']:,.0f}", f"{f['pool_peak_learner_rss_mb']:,.0f}",
            f"{f['single_peak_rss_mb']:,.0f}", f"{f['single_peak_learner_rss_mb']:,.0f}",
            f"{f['memory_ratio']:.2f}", f"{f['pool_tokens_per_s']:.2f}",
            f"{f['per_run_tokens_per_s']:.2f}", f"{f['tokens_per_s_ratio']:.2f}",
            f"{f['pool_window_s']:.1f}", f"{f['per_run_window_s']:.1f}",
            f"{f['completed']}/{2 * k * f['repeats']}",
        )  # fmt: skip
    console = Console(width=140)
    console.print(table)
    console.print(
        f"goals at K = {GOAL_AT}: memory ratio <= {MEMORY_GOAL}, tok/s ratio >= {SPEED_GOAL}; "
        f"memory ratio = pool peak / (largest single × K); {CONTENDED}; {load_average()}"
    )


@contextmanager
def served(tmp: Path) -> Iterator[Any]:
    from tests.harness.live_app import live_app

    # A 30 s learner lease: K runs' heartbeats share one busy process on a shared machine.
    with live_app(f"sqlite:///{tmp / 'asyncgrpo.db'}", tmp, learner_lease_ttl_s=30.0,
                  long_poll_s=1.0) as live:  # fmt: skip
        yield live


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 2, 4], help="values of K")
    parser.add_argument("--steps", type=int, default=4, help="batches (steps) per run")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per batch (2 each)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; figures are medians")
    parser.add_argument("--sample-s", type=float, default=0.15, help="RSS sampling period")
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from lm.models import load_tokenizer

    tok = load_tokenizer(MODEL)
    rounds: dict[int, list[dict[str, Any]]] = {k: [] for k in args.runs}
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as name, served(Path(name)) as live:
        with Progress(console=stderr) as progress:
            for _ in range(args.repeats):
                for k in args.runs:
                    rounds[k].append(measure_k(live, k, args, tok, Path(name), progress))
    results = {k: medians(r) for k, r in rounds.items()}
    print_table(results)
    report.emit(args, {
        "runs": {str(k): f for k, f in results.items()},
        "goal": {"memory_ratio_max": MEMORY_GOAL, "tokens_per_s_ratio_min": SPEED_GOAL,
                 "at_runs": GOAL_AT},
        "steps": args.steps, "prompts": args.prompts, "repeats": args.repeats, "threads": 1,
        "label": f"CPU, {os.cpu_count()} cores; {CONTENDED}", "load": load_average(),
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
