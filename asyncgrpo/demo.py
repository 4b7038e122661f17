"""`asyncgrpo demo`: the embedded server, N rollout workers and the learner on this machine's
CPU with the small model and the `arithmetic` task; a live view polled from the API, a summary
at the end; Ctrl-C (or SIGTERM) stops every process."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from asyncgrpo.cluster import Cluster, ClusterConfig
from protocol.client import ApiError
from protocol.schemas import TERMINAL_RUN_STATUSES

# The demo stops polling at an end, and at a spent budget (nobody is there to resume it).
STOPPED = TERMINAL_RUN_STATUSES | {"budget_exhausted"}
WORKER_PRICE_PER_HOUR = "0.50"  # a simulated spot price, so the spend figures move


def demo_config(versions: int) -> dict[str, Any]:
    """The bundled tiny arithmetic run, ending after `versions` adapter versions."""
    text = resources.files("asyncgrpo").joinpath("demo_run.json").read_text()
    config: dict[str, Any] = json.loads(text)
    config["max_versions"] = versions
    per_epoch = versions * config["prompts_per_step"]
    config["dataset"]["size"] = per_epoch  # one epoch of exactly `versions` steps
    return config


@dataclass
class Snapshot:
    """What one poll of the API saw."""

    run: dict[str, Any]
    metrics: dict[str, Any]
    workers: list[dict[str, Any]]
    at: float = field(default_factory=time.monotonic)

    @property
    def status(self) -> str:
        return str(self.run["status"])

    def reward_by_version(self) -> dict[int, float]:
        """Mean of the learner's per-step reward_mean for each version it trained."""
        sums: dict[int, list[float]] = {}
        for point in self.metrics.get("learner", []):
            value = point["values"].get("reward_mean")
            if value is not None and point.get("version") is not None:
                sums.setdefault(int(point["version"]), []).append(float(value))
        return {v: sum(xs) / len(xs) for v, xs in sorted(sums.items())}


def poll(cluster: Cluster) -> Snapshot:
    assert cluster.admin is not None and cluster.run_id is not None
    return Snapshot(
        run=cluster.admin.get_run(cluster.run_id),
        metrics=cluster.admin.run_metrics(cluster.run_id),
        workers=cluster.admin.list_workers(),
    )


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def live_table(snap: Snapshot | None, cluster: Cluster, started: float) -> Table:
    table = Table(title="asyncgrpo demo", show_header=False, min_width=60)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("elapsed", f"{time.monotonic() - started:.0f} s")
    alive = sum(p.alive() for p in cluster.processes())
    table.add_row("processes alive", f"{alive} / {len(cluster.processes())}")
    if snap is None:
        table.add_row("status", "starting (loading the model in each process)…")
        return table
    stats = snap.run["stats"]
    rewards = snap.reward_by_version()
    last_reward = rewards[max(rewards)] if rewards else None
    proxy = snap.metrics["proxy"]
    active = sum(1 for w in snap.workers if w.get("status") == "active")
    table.add_row("status", snap.status)
    table.add_row("version", str(snap.run["current_version"]))
    table.add_row("reward mean (last step)", _fmt(last_reward))
    table.add_row("stale waste", f"{proxy['stale_waste']:.1%}")
    table.add_row("spend", f"${stats['spend']['total_usd']:.4f}")
    table.add_row("workers (active)", f"{active} / {len(snap.workers)}")
    table.add_row("active leases", str(stats["active_leases"]))
    table.add_row("groups in flight", f"{stats['groups_in_flight']} / "
                  f"{stats['admission_bound_groups']}")  # fmt: skip
    table.add_row("prompt rows", ", ".join(f"{k} {v}" for k, v in stats["prompt_rows"].items()))
    return table


def summary_table(snap: Snapshot, config: dict[str, Any], wall_s: float) -> Table:
    per_batch = int(config["group_size"]) * int(config["prompts_per_lease"])
    proxy = snap.metrics["proxy"]
    rewards = snap.reward_by_version()
    table = Table(title="summary", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("run status", snap.status)
    table.add_row("versions published", str(snap.run["current_version"]))
    if rewards:
        first, last = min(rewards), max(rewards)
        table.add_row(
            "reward mean", f"v{first}: {rewards[first]:.3f} → v{last}: {rewards[last]:.3f}"
        )
    table.add_row("samples generated", str(proxy["samples_generated"]))
    table.add_row("samples accepted", str(proxy["batches_accepted"] * per_batch))
    for reason, n in sorted(proxy["rejected_by_reason"].items()):
        table.add_row(f"samples rejected ({reason})", str(n * per_batch))
    table.add_row("samples aborted (stale leases)", str(proxy["samples_aborted"]))
    table.add_row("stale waste", f"{proxy['stale_waste']:.1%}")
    table.add_row("spend", f"${snap.run['stats']['spend']['total_usd']:.4f}")
    table.add_row("wall time", f"{wall_s:.0f} s")
    return table


def _raise_interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _crashed(cluster: Cluster) -> str | None:
    server, learner = cluster.server, cluster.learner
    if server is not None and not server.alive():
        return f"the server exited ({server.returncode()}); see {server.log_path}"
    if learner is not None and not learner.alive():
        return f"the learner exited ({learner.returncode()}); see {learner.log_path}"
    if cluster.workers and not any(w.alive() for w in cluster.workers.values()):
        return f"every worker exited; see {cluster.dir / 'logs'}"
    return None


def run_demo(
    *, workers: int, port: int | None, versions: int, work_dir: Path, console: Console
) -> int:
    """Run the demo to the end (or Ctrl-C); returns the exit code."""
    started = time.monotonic()
    config = demo_config(versions)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    cluster = Cluster(
        ClusterConfig(
            work_dir=work_dir,
            port=port,
            worker_env={
                "ASYNCGRPO_WORKER_PRICE_PER_HOUR": WORKER_PRICE_PER_HOUR,
                "ASYNCGRPO_WORKER_RETRY_MAX_S": "5",
                "ASYNCGRPO_WORKER_ACQUIRE_WAIT_S": "5",
            },
        )
    )
    snap: Snapshot | None = None
    code = 0
    try:
        console.print(f"work dir: {cluster.dir} (logs in {cluster.dir / 'logs'})")
        console.print("starting the server…")
        cluster.start_server()
        console.print(f"dashboard: [bold]{cluster.url}/[/bold]")
        console.print(f"admin token: [bold]{cluster.admin_token}[/bold]")
        run_id = cluster.create_run(config, registration_uses=workers)
        console.print(f"run {run_id}: {workers} workers and the learner are starting (CPU)")
        cluster.start_learner()
        for i in range(workers):
            cluster.start_worker(f"demo-worker-{i + 1}")
        snap, code = _watch(cluster, console, started)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process…[/yellow]")
        code = 130
    finally:
        # a second Ctrl-C must not cut the stop short (and leave orphans)
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        n = len(cluster.processes())
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        console.print(f"stopped {n} processes")
    if snap is not None:
        console.print(summary_table(snap, config, time.monotonic() - started))
    return code


def _watch(cluster: Cluster, console: Console, started: float) -> tuple[Snapshot | None, int]:
    snap: Snapshot | None = None
    with Live(live_table(None, cluster, started), console=console, refresh_per_second=2) as live:
        while True:
            try:
                snap = poll(cluster)
            except (ApiError, httpx.HTTPError) as exc:
                console.print(f"[yellow]poll failed: {exc}[/yellow]")
            live.update(live_table(snap, cluster, started))
            if snap is not None and snap.status in STOPPED:
                return snap, 0 if snap.status == "completed" else 1
            crash = _crashed(cluster)
            if crash is not None:
                console.print(f"[red]{crash}[/red]")
                return snap, 1
            time.sleep(1.0)
