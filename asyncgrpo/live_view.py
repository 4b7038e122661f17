"""The live table and the summary of a run on this machine (`asyncgrpo demo`, `asyncgrpo
local`), from what the API answers: the run, its metrics and the workers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.table import Table

from asyncgrpo.cluster import Cluster
from protocol.client import ApiError
from protocol.layout import adapter_prefix

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
EDGE_VERSIONS = 3  # the summary compares the mean reward of the first 3 and the last 3 versions


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


def live_table(title: str, snap: Snapshot | None, cluster: Cluster, started: float) -> Table:
    table = Table(title=title, show_header=False, min_width=60)
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


def best_version_text(run: dict[str, Any]) -> str:
    """e.g. "v8 (eval_accuracy 0.594)": the run's best version by its best metric."""
    version, value = run.get("best_version"), run.get("best_value")
    metric = run.get("best_metric", "best metric")
    if version is None or value is None:
        return f"none ranked yet ({metric})"
    base = " — the base model" if version == 0 else ""
    return f"v{version} ({metric} {value:.4g}){base}"


def summary_table(snap: Snapshot, config: dict[str, Any], wall_s: float) -> Table:
    per_batch = int(config["group_size"]) * int(config["prompts_per_lease"])
    proxy = snap.metrics["proxy"]
    table = Table(title="summary", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("run status", snap.status)
    table.add_row("versions published", str(snap.run["current_version"]))
    table.add_row("best version", best_version_text(snap.run))
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
