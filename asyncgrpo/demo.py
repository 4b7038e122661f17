"""`asyncgrpo demo`: the embedded server, N rollout workers and the learner on this machine's
CPU with the small model and the `arithmetic` task; a live view polled from the API, a summary
at the end; Ctrl-C (or SIGTERM) at any moment stops every process (asyncgrpo/interrupts.py), and
the children die with the demo even when it is killed (asyncgrpo/parent_death.py)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from asyncgrpo import interrupts
from asyncgrpo.cluster import Cluster, ClusterConfig
from protocol.client import ApiError
from protocol.layout import adapter_prefix
from protocol.schemas import TERMINAL_RUN_STATUSES

# The demo stops polling at an end, and at a spent budget (nobody is there to resume it).
STOPPED = TERMINAL_RUN_STATUSES | {"budget_exhausted"}
WORKER_PRICE_PER_HOUR = "0.50"  # a simulated spot price, so the spend figures move


SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
EDGE_VERSIONS = 3  # the summary compares the mean reward of the first 3 and the last 3 versions


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


def sparkline(values: list[float]) -> str:
    """One block per value on a fixed 0..1 scale (a reward of 0 is ▁, 1 is █)."""
    top = len(SPARK_BLOCKS) - 1
    return "".join(SPARK_BLOCKS[round(min(max(v, 0.0), 1.0) * top)] for v in values)


def edge_means(rewards: dict[int, float], n: int = EDGE_VERSIONS) -> tuple[float, float] | None:
    """Mean reward of the first `n` and of the last `n` versions (None below 2n versions)."""
    ordered = [rewards[v] for v in sorted(rewards)]
    if len(ordered) < 2 * n:
        return None
    return sum(ordered[:n]) / n, sum(ordered[-n:]) / n


def reuse_notes(work_dir: Path) -> list[str]:
    """What a demo started in `work_dir` finds from an earlier one there (it keeps all of it)."""
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

    def worker_summary(self) -> str:
        """e.g. "2 online, 2 offline": workers by the server's derived state."""
        counts: dict[str, int] = {}
        for worker in self.workers:
            state = str(worker.get("state", worker.get("status")))
            counts[state] = counts.get(state, 0) + 1
        order = ["online", "offline", "quarantined", "revoked"]
        states = sorted(counts, key=lambda k: order.index(k) if k in order else len(order))
        return ", ".join(f"{counts[k]} {k}" for k in states) or "none yet"


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
    table.add_row("status", snap.status)
    table.add_row("version", str(snap.run["current_version"]))
    table.add_row("reward mean (last step)", _fmt(last_reward))
    table.add_row("stale waste", f"{proxy['stale_waste']:.1%}")
    table.add_row("spend", f"${stats['spend']['total_usd']:.4f}")
    table.add_row("workers", snap.worker_summary())
    table.add_row("active leases", str(stats["active_leases"]))
    table.add_row("groups in flight", f"{stats['groups_in_flight']} / "
                  f"{stats['admission_bound_groups']}")  # fmt: skip
    table.add_row("prompt rows", ", ".join(f"{k} {v}" for k, v in stats["prompt_rows"].items()))
    return table


@dataclass(frozen=True)
class FinalAdapter:
    """Where the run's final adapter is: its version, folder in the bucket and API URL."""

    version: int
    bucket_path: str
    url: str


def final_adapter(cluster: Cluster) -> FinalAdapter | None:
    """The run's final version (None when it has none, e.g. after Ctrl-C)."""
    assert cluster.admin is not None and cluster.run_id is not None
    try:
        version = int(cluster.admin.get_adapter(cluster.run_id, "final")["version"])
    except (ApiError, httpx.HTTPError):
        return None
    return FinalAdapter(
        version=version,
        bucket_path=f"{cluster.bucket_location}/{adapter_prefix(cluster.run_id, version)}",
        url=f"{cluster.url}/api/v1/runs/{cluster.run_id}/adapters/final",
    )


def _reward_rows(table: Table, rewards: dict[int, float]) -> None:
    if not rewards:
        table.add_row("reward per version", "— (no version trained)")
        return
    versions = sorted(rewards)
    table.add_row(
        f"reward per version (v{versions[0]}..v{versions[-1]}, 0..1)",
        sparkline([rewards[v] for v in versions]),
    )
    edges = edge_means(rewards)
    if edges is None:
        table.add_row("first / last versions", f"fewer than {2 * EDGE_VERSIONS} versions")
        return
    first, last = edges
    table.add_row(
        f"reward, first {EDGE_VERSIONS} → last {EDGE_VERSIONS}",
        f"{first:.3f} → {last:.3f} ({last - first:+.3f})",
    )


def summary_table(snap: Snapshot, config: dict[str, Any], wall_s: float) -> Table:
    per_batch = int(config["group_size"]) * int(config["prompts_per_lease"])
    proxy = snap.metrics["proxy"]
    table = Table(title="summary", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("run status", snap.status)
    table.add_row("versions published", str(snap.run["current_version"]))
    _reward_rows(table, snap.reward_by_version())
    table.add_row("samples generated", str(proxy["samples_generated"]))
    table.add_row("samples accepted", str(proxy["batches_accepted"] * per_batch))
    for reason, n in sorted(proxy["rejected_by_reason"].items()):
        table.add_row(f"samples rejected ({reason})", str(n * per_batch))
    table.add_row("samples aborted (stale leases)", str(proxy["samples_aborted"]))
    table.add_row("stale waste", f"{proxy['stale_waste']:.1%}")
    table.add_row("spend", f"${snap.run['stats']['spend']['total_usd']:.4f}")
    table.add_row("workers", snap.worker_summary())
    table.add_row("wall time", f"{wall_s:.0f} s")
    return table


def final_adapter_lines(final: FinalAdapter | None) -> list[str]:
    """Where the final adapter is, as whole lines (a table cell would cut the paths)."""
    if final is None:
        return ["no final adapter (the run did not complete)"]
    return [
        f"final adapter (v{final.version}) in the bucket: {final.bucket_path}",
        f"and through the API (while a server runs on this folder): {final.url}",
    ]


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
    *,
    workers: int,
    port: int | None,
    versions: int,
    work_dir: Path,
    console: Console,
    seed: int = 0,
) -> int:
    """Run the demo to the end (or Ctrl-C); returns the exit code."""
    restore_signals = interrupts.install()
    try:
        return _run_demo(workers, port, versions, work_dir, console, seed)
    except KeyboardInterrupt:  # before the cluster existed: there is nothing to stop
        console.print("[yellow]interrupted[/yellow]")
        return 130
    finally:
        restore_signals()


def _run_demo(
    workers: int, port: int | None, versions: int, work_dir: Path, console: Console, seed: int
) -> int:
    started = time.monotonic()
    config = demo_config(versions, seed)
    reused = reuse_notes(work_dir.resolve())
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
    final: FinalAdapter | None = None
    code = 0
    try:
        console.print(f"work dir: {cluster.dir} (logs in {cluster.dir / 'logs'})")
        if reused:
            console.print("[yellow]reusing what an earlier demo left in this folder:[/yellow]")
            for note in reused:
                console.print(f"  - {note}")
            console.print("  (a new run is created; use another --dir for a clean start)")
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
        final = final_adapter(cluster)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process…[/yellow]")
        code = 130
    finally:
        interrupts.stopping()  # a second Ctrl-C must not cut the stop short (and leave orphans)
        n = len(cluster.processes())
        cluster.stop()
        console.print(f"stopped {n} processes")
    if snap is not None:
        console.print(summary_table(snap, config, time.monotonic() - started))
        for line in final_adapter_lines(final):
            console.print(line, soft_wrap=True, highlight=False)
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
