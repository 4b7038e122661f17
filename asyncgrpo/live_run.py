"""One whole run on this machine, watched live: the embedded server, the learner and N rollout
workers (asyncgrpo/cluster.py), a live table polled from the API, a summary at the end.
`asyncgrpo demo` and `asyncgrpo local` are this with their own run and processes. Ctrl-C (or
SIGTERM) at any moment stops every process (asyncgrpo/interrupts.py), and the children die with
their owner even when it is killed (asyncgrpo/parent_death.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live

from asyncgrpo import interrupts
from asyncgrpo.cluster import Cluster, ClusterConfig
from asyncgrpo.live_view import (
    FinalAdapter,
    Snapshot,
    final_adapter,
    final_adapter_lines,
    live_table,
    poll,
    summary_table,
)
from protocol.client import ApiError
from protocol.schemas import TERMINAL_RUN_STATUSES

# Polling stops at an end, and at a spent budget (nobody is there to resume it).
STOPPED = TERMINAL_RUN_STATUSES | {"budget_exhausted"}
ENGINE_START_S = 3600.0  # a staged worker's engine start, its model's first download included
# The workers retry and long-poll for at most 5 s, so a stop never waits on a long call.
QUICK_STOP_WORKER_ENV = {
    "ASYNCGRPO_WORKER_RETRY_MAX_S": "5",
    "ASYNCGRPO_WORKER_ACQUIRE_WAIT_S": "5",
}


class StartFailed(Exception):
    """The run could not start (one line for the console)."""


@dataclass(frozen=True)
class LivePlan:
    """What to run: the run config, the processes' settings, how many workers and their names
    (`<worker_prefix>-1`…), the live table's title and where the processes compute."""

    title: str
    run_config: dict[str, Any]
    cluster: ClusterConfig
    workers: int
    worker_prefix: str
    where: str  # e.g. "CPU", "cuda, vllm"
    # Start the workers one at a time, each once the previous one's engine is up, and the
    # learner last: on a shared GPU, vLLM sizes its KV cache from the memory that went while it
    # started, so a process allocating beside it would shrink it (asyncgrpo local). Otherwise
    # all at once (the demo).
    staged: bool = False


def reuse_notes(work_dir: Path) -> list[str]:
    """What a run started in `work_dir` finds from an earlier one there (it keeps all of it)."""
    notes = []
    if (work_dir / "asyncgrpo.db").exists():
        notes.append("the database asyncgrpo.db (earlier runs, workers and tokens stay listed)")
    if (work_dir / "bucket").is_dir():
        notes.append("the bucket folder bucket/ (earlier runs' adapters stay)")
    token_files = sorted((work_dir / "workers").glob("*/token.json"))
    if token_files:
        names = ", ".join(f.parent.name for f in token_files)
        notes.append(
            f"worker token files ({names}): reused when the server URL is the same (a fixed "
            "--port); otherwise those workers register anew and the old ones go offline"
        )
    return notes


def run_live(plan: LivePlan, console: Console) -> int:
    """Run `plan` to the end (or Ctrl-C); returns the exit code (0 completed, 1 another end or
    a crash, 130 interrupted)."""
    restore_signals = interrupts.install()
    try:
        return _run(plan, console)
    except KeyboardInterrupt:  # before the cluster existed: there is nothing to stop
        console.print("[yellow]interrupted[/yellow]")
        return 130
    finally:
        restore_signals()


def _announce(cluster: Cluster, console: Console) -> None:
    console.print(f"work dir: {cluster.dir} (logs in {cluster.dir / 'logs'})")
    reused = reuse_notes(cluster.dir)
    if reused:
        console.print("[yellow]reusing what an earlier run left in this folder:[/yellow]")
        for note in reused:
            console.print(f"  - {note}")
        console.print("  (a new run is created; use another --dir for a clean start)")


def _start(plan: LivePlan, cluster: Cluster, console: Console) -> None:
    console.print("starting the server…")
    cluster.start_server()
    console.print(f"dashboard: [bold]{cluster.url}/[/bold]")
    console.print(f"admin token: [bold]{cluster.admin_token}[/bold]")
    try:
        run_id = cluster.create_run(plan.run_config, registration_uses=plan.workers)
    except ApiError as exc:  # a run the server refuses (what the config model alone cannot see)
        raise StartFailed(f"the server refused the run ({exc.code or 'error'}): {exc}") from None
    n = plan.workers
    console.print(
        f"run {run_id}: {n} worker{'s' if n != 1 else ''} and the learner are starting "
        f"({plan.where})",
        soft_wrap=True,
    )
    names = [f"{plan.worker_prefix}-{i + 1}" for i in range(plan.workers)]
    if not plan.staged:
        cluster.start_learner()
    for name in names:
        cluster.start_worker(name)
        if plan.staged:
            console.print(f"{name}: starting its engine…")
            cluster.wait_worker_ready(name, ENGINE_START_S)
    if plan.staged:
        console.print("the workers are up; starting the learner")
        cluster.start_learner()


def _run(plan: LivePlan, console: Console) -> int:
    started = time.monotonic()
    cluster = Cluster(plan.cluster)
    snap: Snapshot | None = None
    final: FinalAdapter | None = None
    code = 0
    try:
        _announce(cluster, console)
        _start(plan, cluster, console)
        snap, code = _watch(plan.title, cluster, console, started)
        final = final_adapter(cluster)
    except (StartFailed, RuntimeError, TimeoutError) as exc:  # a refusal, a process that
        # exited or never came up (the server, a staged worker)
        console.print(str(exc), style="red", markup=False, highlight=False)
        code = 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process…[/yellow]")
        code = 130
    finally:
        interrupts.stopping()  # a second Ctrl-C must not cut the stop short (and leave orphans)
        n = len(cluster.processes())
        cluster.stop()
        console.print(f"stopped {n} processes")
    if snap is not None:
        console.print(summary_table(snap, plan.run_config, time.monotonic() - started))
        for line in final_adapter_lines(final):
            console.print(line, soft_wrap=True, highlight=False)
    return code


def _exit_code(ended: Snapshot) -> int:
    return 0 if ended.status == "completed" else 1


def _crashed(cluster: Cluster) -> str | None:
    server, learner = cluster.server, cluster.learner
    if server is not None and not server.alive():
        return f"the server exited ({server.returncode()}); see {server.log_path}"
    if learner is not None and not learner.alive():
        return f"the learner exited ({learner.returncode()}); see {learner.log_path}"
    if cluster.workers and not any(w.alive() for w in cluster.workers.values()):
        return f"every worker exited; see {cluster.dir / 'logs'}"
    return None


def _watch(
    title: str, cluster: Cluster, console: Console, started: float
) -> tuple[Snapshot | None, int]:
    table = live_table(title, None, cluster, started)
    try:
        with Live(table, console=console, refresh_per_second=2) as live:
            return _poll_until_the_end(title, cluster, console, started, live)
    finally:
        if not console.is_terminal:  # a file gets the last frame without its line's end
            console.line()


def _poll_until_the_end(
    title: str, cluster: Cluster, console: Console, started: float, live: Live
) -> tuple[Snapshot | None, int]:
    snap: Snapshot | None = None
    while True:
        interrupts.check()
        try:
            snap = poll(cluster)
        except (ApiError, httpx.HTTPError) as exc:
            console.print(f"[yellow]poll failed: {exc}[/yellow]")
        live.update(live_table(title, snap, cluster, started))
        if snap is not None and snap.status in STOPPED:
            return snap, _exit_code(snap)
        crash = _crashed(cluster)
        if crash is not None:
            return _after_crash(crash, cluster, console, snap)
        time.sleep(1.0)


def _after_crash(
    crash: str, cluster: Cluster, console: Console, snap: Snapshot | None
) -> tuple[Snapshot | None, int]:
    """The learner exits once its final publish ended the run: a run that ended between the
    poll and the look at the processes ended, it did not crash."""
    try:
        snap = poll(cluster)
    except (ApiError, httpx.HTTPError):
        pass
    if snap is not None and snap.status in STOPPED:
        return snap, _exit_code(snap)
    console.print(f"[red]{crash}[/red]")
    return snap, 1
