"""Adapter sync latency: from the learner's publish to the first worker generating with it.

Real parts: the control plane (uvicorn, Postgres), moto's S3 server in its own process, and
rollout workers (`asyncgrpo worker`, transformers on CPU) through asyncgrpo/cluster.py. The
learner is scripted, so that no training time hides in the figures: it attaches with the
learner token, claims whatever batches are ready and publishes version N+1 through the real
learner calls (request_uploads → presigned PUTs → publish_adapter, consuming the claimed
batches) with a real PEFT LoRA adapter (all linear layers of the small model, fp32) whose rank
is chosen to give a 5, 40 or 80 MB adapter_model.safetensors. Every version has new weights.

Workers learn of a version from their version feed (a long-poll, `GET /api/v1/versions`,
docs/architecture/worker.md, "The worker") and load it in the background: download through presigned
GETs (sha256 checked), then into the engine (an existing adapter slot takes the new weights by a
copy). The next lease of the run carries the new version and generates with it at once. The
workers log each moment ("adapter … downloaded in Xs", "adapter run=… vN ready (push) in Xs",
"lease … generating with run=… vN"); this script reads the timestamps from the logs. Per
version:

    publish→gen   from the start of the publish (files on the learner's disk, uploads begin)
                  to the first worker's first generation with the version
    ack→gen       from publish_adapter's answer to that moment
    all workers   from the start of the publish to the last worker's first generation
Breakdown (medians): upload, notice (ack → download start), download, load (download end →
ready in the engine). Goal (issue 15): publish→gen p50 ≤ 1.25 × (upload + download) — all but
moving the bytes costs at most a quarter of moving them.

The first `--warmup-versions` (2) of each size are published and not measured: on them a worker
builds its two adapter slots for that shape (0.25 s each here, a new PEFT adapter); every later
version is a copy into a slot, the steady state a long run lives in. Between versions the
script waits a random 1–3 s, so that the publish lands at a random point of the workers' lease
cycle. Published comparison: Hugging Face's async GRPO + LoRA bucket
recipe, p50 8.5 s, later 6.2 s (3×H200 + 2×H200, Qwen2.5-Math-1.5B).

    .venv/bin/python bench/sync_latency.py [--sizes 5 40 80] [--versions 6] [--workers 2] [--json]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncgrpo.cluster import Cluster  # noqa: E402
from bench import common, report  # noqa: E402
from bench.common import (  # noqa: E402
    ALL_LINEAR,
    Published,
    Publisher,
    build_templates,
    version_folder,
)
from tests.harness.runs import LIVE_RUN, arithmetic  # noqa: E402
from tests.harness.runs import run_config as harness_run_config  # noqa: E402
from tests.harness.stack import moto_process  # noqa: E402


def run_config(max_new_tokens: int) -> dict[str, Any]:
    """Short leases (1 prompt, G = 2, a few tokens) so a lease cycle is short next to sync."""
    return harness_run_config(
        LIVE_RUN,
        name="bench-sync-latency",
        dataset=arithmetic(5000),
        lora={**LIVE_RUN["lora"], "target_modules": ALL_LINEAR},
        grpo={"spot_check_fraction": 0.0},
        sampling={"temperature": 1.0, "max_new_tokens": max_new_tokens},
        group_size=2,
        prompts_per_lease=1,
        prompts_per_step=1,
        max_staleness=32,  # admission never blocks between two publishes
        lease_ttl_s=60.0,
        heartbeat_interval_s=5.0,
    )


# -- worker timestamps ---------------------------------------------------------------------------


@dataclass
class Pickup:
    generating_at: float  # the first generation with the version
    loaded_at: float  # ready in the engine
    downloaded_at: float
    download_s: float


def pickup(log_text: str, run_id: str, version: int) -> Pickup | None:
    """When a worker downloaded, loaded and first generated with `version` (None: not yet)."""
    down = common.log_stamp(rf"adapter run={run_id} v{version} downloaded in ([0-9.]+)s", log_text)
    ready = common.log_stamp(rf"adapter run={run_id} v{version} ready \(", log_text)
    generating_at = common.first_generation(log_text, run_id, version)
    if down is None or ready is None or generating_at is None:
        return None
    return Pickup(generating_at, common.log_time(ready.group(1)),
                  common.log_time(down.group(1)), float(down.group(2)))  # fmt: skip


def wait_pickups(
    cluster: Cluster, publisher: Publisher, run_id: str, version: int, timeout_s: float
) -> dict[str, Pickup]:
    found: dict[str, Pickup] = {}
    deadline = time.monotonic() + timeout_s
    while len(found) < len(cluster.workers) and time.monotonic() < deadline:
        for name, proc in cluster.workers.items():
            if name not in found:
                got = pickup(proc.log_text(), run_id, version)
                if got is not None:
                    found[name] = got
        publisher.claim()  # keep the admission counter low, as a learner would
        time.sleep(0.2)
    return found


# -- main ----------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, work: Path) -> list[tuple[Published, dict[str, Pickup]]]:
    common.exit_on_sigterm()
    results = []
    templates = build_templates(args.sizes, work / "templates")
    with common.postgres_db() as db, moto_process(work, common.S3_KEYS) as moto:
        # Two leases in flight per worker: on one CPU thread the transformers engine runs one
        # forward batch at a time, and a load (or a new version's first generation) waits for
        # the batch under way; two adapter slots, so versions from the third on are copies.
        env = {"ASYNCGRPO_WORKER_MAX_INFLIGHT_SEQUENCES": "4",
               "ASYNCGRPO_WORKER_MAX_LOADED_ADAPTERS": "2"}  # fmt: skip
        cluster = Cluster(common.bench_cluster(work, db, moto.bucket, **env))
        with cluster:
            cluster.start_server()
            run_id = cluster.create_run(run_config(args.max_new_tokens))
            names = [f"w{i}" for i in range(args.workers)]
            for name in names:
                cluster.start_worker(name)
            assert cluster.learner_token is not None
            publisher = Publisher(cluster.url, run_id, cluster.learner_token, work)
            try:
                common.wait_workers_ready(cluster, names)
                time.sleep(3)  # let both workers enter their lease cycle on version 0
                for size in args.sizes:
                    for i in range(args.warmup_versions + args.versions):
                        folder = version_folder(
                            templates[size], publisher.version + 1, work / "versions"
                        )
                        pub = publisher.publish(folder, size)
                        found = wait_pickups(cluster, publisher, run_id, pub.version, 180)
                        warm = i >= args.warmup_versions
                        if warm:
                            results.append((pub, found))
                        print(_line(pub, found) + ("" if warm else " (warm-up)"), flush=True)
                        time.sleep(random.uniform(1.0, 3.0))
            finally:
                publisher.close()
    return results


def _line(pub: Published, found: dict[str, Pickup]) -> str:
    firsts = ", ".join(
        f"{n} {p.generating_at - pub.t_start:.2f}s" for n, p in sorted(found.items())
    )
    return f"v{pub.version} {pub.size_mb} MB: upload {pub.upload_s:.2f}s; generating: {firsts}"


FIGURES = (
    "pub_gen_p50", "pub_gen_p90", "ack_gen_p50", "ack_gen_p90", "all_workers_p50",
    "upload_p50", "notice_p50", "download_p50", "load_p50", "push_overhead",
)  # fmt: skip


def figures_by_size(
    results: list[tuple[Published, dict[str, Pickup]]], sizes: list[int]
) -> dict[int, dict[str, Any] | None]:
    """Per adapter size: the versions measured and the latencies (s); None when none was."""
    out: dict[int, dict[str, Any] | None] = {}
    for size in sizes:
        mine = [(p, f) for p, f in results if p.size_mb == size and f]
        if not mine:
            out[size] = None
            continue
        first = [min(x.generating_at for x in f.values()) - p.t_start for p, f in mine]
        ack = [min(x.generating_at for x in f.values()) - p.t_ack for p, f in mine]
        last = [max(x.generating_at for x in f.values()) - p.t_start for p, f in mine]
        picks = [(p, x) for p, f in mine for x in f.values()]
        notice = [x.downloaded_at - x.download_s - p.t_ack for p, x in picks]
        upload = common.median([p.upload_s for p, _f in mine])
        download = common.median([x.download_s for _p, x in picks])
        out[size] = {
            "file_mb": mine[0][0].bytes / common.MB, "n": len(mine),
            "pub_gen_p50": common.percentile(first, 50),
            "pub_gen_p90": common.percentile(first, 90),
            "ack_gen_p50": common.percentile(ack, 50),
            "ack_gen_p90": common.percentile(ack, 90),
            "all_workers_p50": common.percentile(last, 50),
            "upload_p50": upload,
            "notice_p50": common.median(notice),
            "download_p50": download,
            "load_p50": common.median([x.loaded_at - x.downloaded_at for _p, x in picks]),
            # the goal's ratio: publish→gen over the time the bytes must move (≤ 1.25)
            "push_overhead": common.percentile(first, 50) / (upload + download),
        }  # fmt: skip
    return out


def print_report(figures: dict[int, dict[str, Any] | None]) -> None:
    rows = []
    for size, f in figures.items():
        if f is None:
            rows.append([size, "—", 0, *["—"] * len(FIGURES)])
        else:
            rows.append([size, f"{f['file_mb']:.1f}", f["n"], *(f[k] for k in FIGURES)])
    common.print_table(
        "Adapter sync latency, seconds (moto S3 in its own process; "
        f"{common.CONTENDED}; {common.load_average()})",
        [
            "MB",
            "file MB",
            "n",
            "pub→gen p50",
            "p90",
            "ack→gen p50",
            "p90",
            "all wkrs p50",
            "upload",
            "notice",
            "download",
            "load",
            "÷ bytes",
        ],
        rows,
    )
    print("Published (HF async GRPO + LoRA bucket recipe, 3+2 H200): p50 8.5 s, later 6.2 s.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 40, 80])
    parser.add_argument("--versions", type=int, default=6, help="versions measured per size")
    parser.add_argument(
        "--warmup-versions", type=int, default=2,
        help="versions published first per size and not measured: a worker builds its adapter "
        "slots for a new adapter shape (rank) on them; later versions are copies into a slot",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    report.add_json_flag(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        results = measure(args, Path(tmp))
    figures = figures_by_size(results, args.sizes)
    print_report(figures)
    report.emit(args, {"sizes": {str(size): f for size, f in figures.items()}})


if __name__ == "__main__":
    main()
