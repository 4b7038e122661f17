"""Learner pipeline: how much of the wall time the real learner trains when batches never run
short, with its overlap on (ASYNCGRPO_LEARNER_OVERLAP=1, the default) and off (0, one thing at
a time).

Real parts: the control plane (uvicorn, Postgres, as the other benchmarks), moto's S3 server in
its own process and the real learner process (`asyncgrpo learner`, through asyncgrpo/cluster.py,
`--threads` torch threads). The rollout workers are scripted threads of this process, so that
the learner never waits for generation: each registers, acquires leases (long-poll) and answers
every lease at once with a valid batch written by the real writer (protocol/batches.py) — the
lease's prompts tokenized with the small model's chat template (worker/prompts.py), the lease's
adapter version and sha256 stamped — uploaded through the presigned PUT and completed through
the lease API, as the real worker does. The completions are prebuilt before the loop: seeded
token ids of a long-tailed length mix (lognormal, median `--tokens`/4, σ 0.8, capped at
`--tokens`; an EOS ends those under the cap), behaviour log-probs uniform in [-12, -1]. The
reward is `length_limit` (protocol/rewards.py) on the decoded text, so rewards vary within a
group. The learner re-scores no batch: ASYNCGRPO_LEARNER_SPOT_CHECK_FRACTION=0 (and the run's
spot_check_fraction 0), since made-up log-probs are far from its own.

Per step: `learner_busy` (the learner's metric, time in forward/backward/optimizer ÷ wall time
since the previous step), or where the learner does not post it, step_seconds ÷ the time
between the two steps' metric points (the table says which); `intake_wait_s` and `publish_s`
when posted. Pipeline efficiency: completion tokens trained ÷ wall time from the first step's
start (its metric point's time − its step_seconds) to the last step's metric point, over the
same groups' tokens ÷ wall time trained preloaded in memory: after the loop, a fresh process
loads the model the same way the learner does (lm.models.load_model, learner.trainer.add_lora,
the run's seed) and times `Trainer.train_step` over the very groups the learner consumed, step
by step (same run config, threads and device), `--preloaded-repeats` times (the median wall
time counts). Goal: ≥ 0.9 on CPU with the overlap on. On a shared machine the two
measurements can meet different loads: the table gives the load average after each and the
preloaded process's CPU time ÷ wall (1.0: it had its core to itself). Also per mode: the
claimable groups (accepted, not yet claimed) sampled every 0.25 s during the loop, to show the
scripted workers kept ahead.

    .venv/bin/python bench/pipeline.py [--versions 6] [--prompts 2] [--group 4] [--tokens 32]
        [--threads 1] [--device cpu] [--modes overlap serial] [--preloaded-repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # a plain script: the repository root, not bench/, on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import common, report  # noqa: E402
from tests.harness.runs import LIVE_RUN, arithmetic  # noqa: E402
from tests.harness.runs import run_config as harness_run_config  # noqa: E402
from tests.harness.stack import moto_process  # noqa: E402

log = logging.getLogger("bench.pipeline")
MODES = {"overlap": "1", "serial": "0"}  # ASYNCGRPO_LEARNER_OVERLAP
LENGTH_SIGMA = 0.8
LOGPROB_RANGE = (-12.0, -1.0)
FIRST_FREE_TOKEN = 100  # random completion ids stay clear of the special tokens
SAMPLE_EVERY_S = 0.25


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """Short completions and a few groups per step, so that a CPU step takes a few seconds."""
    return harness_run_config(
        LIVE_RUN,
        name="bench-pipeline",
        dataset=arithmetic(5000),
        rewards=[{"name": "length_limit", "weight": 1.0, "kwargs": {"max_chars": args.max_chars}}],
        grpo={"spot_check_fraction": 0.0},
        sampling={"temperature": 1.0, "max_new_tokens": args.tokens},
        group_size=args.group,
        prompts_per_lease=1,
        prompts_per_step=args.prompts,
        max_staleness=3,  # the admission bound holds 4 steps of groups: never the limit
        max_versions=args.versions,
        lease_ttl_s=60.0,
        heartbeat_interval_s=5.0,
    )


# -- prebuilt completions ------------------------------------------------------------------------


@dataclass(frozen=True)
class LengthMix:
    """Completion lengths: lognormal around a median, capped (a long tail at the cap)."""

    cap: int
    sigma: float = LENGTH_SIGMA

    @property
    def median(self) -> float:
        return max(1.0, self.cap / 4)

    def draw(self, rng: random.Random) -> int:
        length = round(rng.lognormvariate(math.log(self.median), self.sigma))
        return max(1, min(self.cap, length))


@dataclass(frozen=True)
class Prebuilt:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


def prebuild(n: int, mix: LengthMix, vocab: int, eos: int, seed: int) -> list[Prebuilt]:
    """`n` completions: seeded random tokens; those under the cap end with the EOS."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = mix.draw(rng)
        ids = [rng.randrange(FIRST_FREE_TOKEN, vocab) for _ in range(length)]
        finish = "length" if length == mix.cap else "stop"
        if finish == "stop":
            ids[-1] = eos
        logprobs = [rng.uniform(*LOGPROB_RANGE) for _ in range(length)]
        out.append(Prebuilt(ids, logprobs, finish))
    return out


class Pool:
    """Hands out prebuilt completions in turn (thread-safe), cycling."""

    def __init__(self, completions: list[Prebuilt]) -> None:
        self.completions, self.next, self.lock = completions, 0, threading.Lock()

    def take(self, n: int) -> list[Prebuilt]:
        with self.lock:
            start, self.next = self.next, self.next + n
        return [self.completions[(start + i) % len(self.completions)] for i in range(n)]


# -- scripted workers ----------------------------------------------------------------------------


@dataclass
class Served:
    """One lease answered: the prompts (for the rewards) and the rows of its batch."""

    prompts: list[Any]
    samples: list[Any]  # RolloutSample


class ScriptedWorker(threading.Thread):
    """Registers, then answers every lease at once with a prebuilt batch: write → presigned PUT
    → complete, as worker/lease_work.py does after generating."""

    def __init__(self, cluster: Any, name: str, shared: Shared, out_dir: Path,
                 stopped: threading.Event) -> None:  # fmt: skip
        super().__init__(daemon=True, name=f"scripted-{name}")
        self.url, self.registration_token = cluster.url, str(cluster.registration_token)
        self.worker_name, self.shared, self.out_dir, self.stopped = name, shared, out_dir, stopped
        self.worker_id = ""
        self.served: dict[uuid.UUID, Served] = {}
        self.rejected = 0
        self.errors: list[str] = []

    def run(self) -> None:
        from protocol.client import AsyncGrpoClient

        with AsyncGrpoClient(self.url) as anonymous:
            registered = anonymous.register_worker(
                self.registration_token, name=self.worker_name, models=[common.MODEL]
            )
        with AsyncGrpoClient(self.url, str(registered["token"])) as client:
            self.worker_id = str(registered["id"])
            while not self.stopped.is_set():
                try:
                    lease = client.acquire_lease(models=[common.MODEL], wait_s=1.0)
                    if lease is not None:
                        self.serve(client, lease)
                except Exception as exc:  # a lease ended under us (run completed): go on
                    self.errors.append(repr(exc))
                    self.stopped.wait(0.2)

    def serve(self, client: Any, lease: Any) -> None:
        from protocol.batches import BatchMetadata, RolloutSample, write_batch
        from protocol.schemas import BatchManifest
        from protocol.storage import PresignedPut
        from protocol.transfer import upload_presigned

        prompt_ids = self.shared.encoder.encode(lease.prompts, lease.system_prompt)
        completions = self.shared.pool.take(len(lease.prompts) * lease.group_size)
        samples = [
            RolloutSample(
                prompt_row_id=p.prompt_row_id,
                group_index=j,
                prompt_token_ids=prompt_ids[i],
                completion_token_ids=c.token_ids,
                behaviour_logprobs=c.logprobs,
                finish_reason=c.finish_reason,
            )
            for i, p in enumerate(lease.prompts)
            for j, c in enumerate(completions[i * lease.group_size : (i + 1) * lease.group_size])
        ]
        metadata = BatchMetadata(
            run_id=str(lease.run_id),
            lease_id=str(lease.lease_id),
            fencing=lease.fencing,
            worker_id=self.worker_id,
            adapter_version=lease.adapter_version,
            adapter_sha256=lease.adapter.sha256 if lease.adapter else None,
            tokenizer_fingerprint=self.shared.fingerprint,
            sampling=dict(lease.sampling),
        )
        path = self.out_dir / f"{lease.lease_id}.parquet"
        info = write_batch(path, metadata, samples)
        try:
            put = client.upload_url(lease, size=info.bytes, sha256=info.sha256)
            upload_presigned(PresignedPut(put.url, put.headers), path)
            manifest = BatchManifest(key=put.key, sha256=info.sha256, size=info.bytes,
                                     n_samples=info.n_samples, n_tokens=info.n_tokens,
                                     generation_seconds=0.0)  # fmt: skip
            answer = client.complete_lease(lease, manifest)
        finally:
            path.unlink(missing_ok=True)
        if answer.state == "accepted":
            self.served[lease.lease_id] = Served([p.prompt for p in lease.prompts], samples)
        else:
            self.rejected += 1


# -- sampling the claimable groups -----------------------------------------------------------------


class ReadySampler(threading.Thread):
    """Every SAMPLE_EVERY_S: the run's accepted (claimable, not yet claimed) groups."""

    def __init__(self, database_url: str, run_id: str) -> None:
        super().__init__(daemon=True, name="ready-sampler")
        from sqlalchemy import create_engine

        self.engine = create_engine(database_url)
        self.run_id = uuid.UUID(run_id)
        self.samples: list[tuple[float, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        from sqlalchemy import text

        query = text(
            "SELECT COALESCE(SUM(n_groups), 0) FROM rollout_batches "
            "WHERE run_id = :r AND state = 'accepted'"
        )
        while not self.stopped.wait(SAMPLE_EVERY_S):
            with self.engine.connect() as conn:
                ready = int(conn.execute(query, {"r": self.run_id}).scalar_one())
            self.samples.append((time.time(), ready))

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=5)
        self.engine.dispose()

    def within(self, start: float, end: float) -> list[int]:
        return [ready for t, ready in self.samples if start <= t <= end]


# -- one mode: the loop --------------------------------------------------------------------------


@dataclass
class StepPoint:
    step: int
    version: int | None
    at: float  # epoch seconds the point was stored (just after the step ended)
    values: dict[str, Any]

    @property
    def seconds(self) -> float:
        return float(self.values.get("step_seconds", 0.0))

    @property
    def tokens(self) -> int:
        return int(self.values.get("completion_tokens", 0))


def learner_points(metrics: dict[str, Any]) -> list[StepPoint]:
    from datetime import datetime

    points = [
        StepPoint(int(p["step"]), p.get("version"),
                  datetime.fromisoformat(str(p["created_at"])).timestamp(), dict(p["values"]))
        for p in metrics["learner"]
        if "step_seconds" in p["values"]
    ]  # fmt: skip
    return sorted(points, key=lambda p: p.step)


def consumed_steps(
    database_url: str, run_id: str, served: dict[uuid.UUID, Served], config: Any, tokenizer: Any
) -> list[list[dict[str, Any]]]:
    """The groups the learner consumed, per version (= per step: weight_sync_steps 1), in
    claim order, with the rewards the learner computes (protocol.rewards.combine on the
    decoded completions)."""
    from protocol.rewards import combine

    rows = common.sql(
        database_url,
        "SELECT lease_id, consumed_version FROM rollout_batches WHERE run_id = :r AND "
        "state = 'consumed' ORDER BY consumed_version, created_at",
        r=uuid.UUID(run_id),
    )
    steps: dict[int, list[dict[str, Any]]] = {}
    g = config.group_size
    for lease_id, version in rows:
        batch = served[lease_id]
        texts = [
            tokenizer.decode(s.completion_token_ids, skip_special_tokens=True)
            for s in batch.samples
        ]
        prompts = [batch.prompts[i // g] for i in range(len(batch.samples))]
        rewards = combine(config.rewards, prompts, texts, {}).total
        for start in range(0, len(batch.samples), g):
            rows_of_group = batch.samples[start : start + g]
            steps.setdefault(int(version), []).append(
                {
                    "prompt": list(rows_of_group[0].prompt_token_ids),
                    "completions": [list(s.completion_token_ids) for s in rows_of_group],
                    "logprobs": [list(s.behaviour_logprobs) for s in rows_of_group],
                    "rewards": rewards[start : start + g],
                }
            )
    return [steps[v] for v in sorted(steps)]


@dataclass
class Loop:
    """What one mode's run left: its per-step points, the consumed groups, worker figures."""

    points: list[StepPoint]
    steps: list[list[dict[str, Any]]]
    ready: list[int]
    rejected: int
    worker_errors: int

    @property
    def start(self) -> float:
        return self.points[0].at - self.points[0].seconds

    @property
    def end(self) -> float:
        return self.points[-1].at


def run_loop(cluster: Any, db: str, args: argparse.Namespace, mode: str, shared: Shared) -> Loop:
    """One run to its last version with the real learner and scripted workers."""
    from protocol.run_config import RunConfig

    config = run_config(args)
    run_id = cluster.create_run(config)
    stopped = threading.Event()
    out_dir = cluster.dir / "scripted" / mode
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = [
        ScriptedWorker(cluster, f"{mode}-{i}", shared, out_dir, stopped)
        for i in range(args.workers)
    ]
    for worker in workers:
        worker.start()
    cluster.config.learner_env["ASYNCGRPO_LEARNER_OVERLAP"] = MODES[mode]
    sampler = ReadySampler(db, run_id)
    sampler.start()
    learner = cluster.start_learner()
    try:
        status = common.wait_run_finished(cluster, run_id, args.timeout)
    finally:
        stopped.set()
        sampler.stop()
        learner.stop(grace_s=10)
        for worker in workers:
            worker.join(timeout=10)
    print(f"{mode}: run {status}", flush=True)
    points = learner_points(cluster.admin.run_metrics(run_id))
    if not points:
        raise RuntimeError(f"{mode}: the learner posted no step:\n{learner.log_text()[-3000:]}")
    served = {k: v for w in workers for k, v in w.served.items()}
    parsed = RunConfig.model_validate(config)
    steps = consumed_steps(db, run_id, served, parsed, shared.tokenizer)
    loop = Loop(points, steps, [], sum(w.rejected for w in workers),
                sum(len(w.errors) for w in workers))  # fmt: skip
    loop.ready = sampler.within(loop.start, loop.end)
    return loop


# -- one mode: the same groups preloaded ---------------------------------------------------------


def train_preloaded(path: Path, threads: int, device: str, repeats: int) -> dict[str, Any]:
    """In this (fresh) process: load the model as the learner does and time train_step over
    the saved steps, `repeats` times (the model loaded afresh each time, untimed). Returns each
    repeat's wall time and CPU share (process CPU time ÷ wall: under 1 on one thread means
    other processes took the core), the median repeat's step seconds and the tokens."""
    import torch

    from learner.data import Completion, Group
    from learner.trainer import Trainer, add_lora
    from lm.models import load_model, load_tokenizer, set_threads
    from protocol.run_config import RunConfig

    saved = json.loads(path.read_text())
    config = RunConfig.model_validate(saved["config"])
    set_threads(threads)
    tokenizer: Any = load_tokenizer(config.base_model)
    pad = tokenizer.pad_token_id
    pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
    steps = [
        [
            Group([Completion(g["prompt"], ids, lp)
                   for ids, lp in zip(g["completions"], g["logprobs"], strict=True)], g["rewards"])
            for g in groups
        ]
        for groups in saved["steps"]
    ]  # fmt: skip
    runs = []
    for _ in range(repeats):
        torch.manual_seed(config.seed)
        model = add_lora(load_model(config.base_model, device=device), config)
        trainer = Trainer(model, config, pad_id=pad_id, device=device)
        started, cpu_started = time.perf_counter(), time.process_time()
        metrics = [trainer.train_step(groups) for groups in steps]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
        cpu_share = (time.process_time() - cpu_started) / wall / threads
        runs.append((wall, cpu_share, [m["step_seconds"] for m in metrics]))
        del trainer, model
    tokens = [int(m["completion_tokens"]) for m in metrics]
    median_run = sorted(runs)[len(runs) // 2]
    return {
        "walls_s": [r[0] for r in runs],
        "cpu_shares": [r[1] for r in runs],
        "step_seconds": median_run[2],
        "tokens": tokens,
    }


def preloaded(loop: Loop, args: argparse.Namespace, work: Path, mode: str) -> dict[str, Any]:
    """train_preloaded in a subprocess with the learner's environment (one-thread settings)."""
    from asyncgrpo.cluster import ONE_THREAD, PACKAGE_ROOT

    path = work / f"steps-{mode}.json"
    path.write_text(json.dumps({"config": run_config(args), "steps": loop.steps}))
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(PACKAGE_ROOT)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--train-preloaded", str(path),
            "--threads", str(args.threads), "--device", args.device,
            "--preloaded-repeats", str(args.preloaded_repeats)]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"preloaded training failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- figures -------------------------------------------------------------------------------------


def busy_series(points: Sequence[StepPoint]) -> tuple[list[float | None], str]:
    """Per step: the learner's `learner_busy`, or step_seconds ÷ the time since the previous
    step's point (None for the first step, which has none); and which one it is."""
    if all("learner_busy" in p.values for p in points):
        return [float(p.values["learner_busy"]) for p in points], "learner_busy (learner metric)"
    series: list[float | None] = [None]
    for prev, cur in zip(points, points[1:], strict=False):
        gap = cur.at - prev.at
        series.append(cur.seconds / gap if gap > 0 else None)
    return series, "computed: step_seconds ÷ time between metric points"


def optional_series(points: Sequence[StepPoint], name: str) -> list[float | None]:
    return [float(p.values[name]) if name in p.values else None for p in points]


def _median(values: Sequence[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return common.median(found) if found else None


def efficiency_after_first_step(points: Sequence[StepPoint], pre: dict[str, Any]) -> float | None:
    """The same ratio over steps 2..N only (the first step warms the process up, and its share
    of a short run is large): loop tokens ÷ time between the first and last step's points, over
    the preloaded tokens ÷ the preloaded steps' seconds."""
    if len(points) < 2:
        return None
    loop_wall = points[-1].at - points[0].at
    pre_seconds = sum(pre["step_seconds"][1:])
    if loop_wall <= 0 or pre_seconds <= 0:
        return None
    loop_rate = sum(p.tokens for p in points[1:]) / loop_wall
    return loop_rate / (sum(pre["tokens"][1:]) / pre_seconds)


def mode_figures(loop: Loop, pre: dict[str, Any], per_step: int) -> dict[str, Any]:
    busy, busy_source = busy_series(loop.points)
    tokens = sum(p.tokens for p in loop.points)
    loop_wall = loop.end - loop.start
    loop_rate = tokens / loop_wall if loop_wall > 0 else 0.0
    pre_tokens = sum(pre["tokens"])
    pre_wall = common.median(pre["walls_s"])
    pre_rate = pre_tokens / pre_wall if pre_wall > 0 else 0.0
    steady = busy[1:] if busy_source.startswith("computed") else busy
    return {
        "pipeline_efficiency_after_first_step": efficiency_after_first_step(loop.points, pre),
        "steps": len(loop.points),
        "completion_tokens": tokens,
        "preloaded_completion_tokens": pre_tokens,
        "loop_wall_s": loop_wall,
        "loop_tokens_per_s": loop_rate,
        "preloaded_wall_s": pre_wall,
        "preloaded_walls_s": pre["walls_s"],
        "preloaded_cpu_share": common.median(pre["cpu_shares"]),
        "preloaded_tokens_per_s": pre_rate,
        "pipeline_efficiency": loop_rate / pre_rate if pre_rate > 0 else 0.0,
        "busy_source": busy_source,
        "learner_busy_median": _median(steady),
        "step_seconds_median": _median([p.seconds for p in loop.points]),
        "preloaded_step_seconds_median": _median(pre["step_seconds"]),
        "intake_wait_s_median": _median(optional_series(loop.points, "intake_wait_s")),
        "publish_s_median": _median(optional_series(loop.points, "publish_s")),
        "ready_groups_median": _median([float(r) for r in loop.ready]),
        "ready_below_one_step": (
            sum(r < per_step for r in loop.ready) / len(loop.ready) if loop.ready else None
        ),
        "batches_rejected": loop.rejected,
        "worker_errors": loop.worker_errors,
        "per_step": [
            {
                "step": p.step,
                "version": p.version,
                "tokens": p.tokens,
                "step_s": p.seconds,
                "busy": b,
                "intake_wait_s": p.values.get("intake_wait_s"),
                "publish_s": p.values.get("publish_s"),
            }
            for p, b in zip(loop.points, busy, strict=True)
        ],  # fmt: skip
    }


SUMMARY = (
    ("pipeline efficiency (loop ÷ preloaded tok/s)", "pipeline_efficiency"),
    ("the same, steps 2..N only", "pipeline_efficiency_after_first_step"),
    ("learner busy, median of steps", "learner_busy_median"),
    ("loop completion tok/s", "loop_tokens_per_s"),
    ("preloaded completion tok/s", "preloaded_tokens_per_s"),
    ("loop wall s (first step start → last step end)", "loop_wall_s"),
    ("preloaded wall s (median of repeats)", "preloaded_wall_s"),
    ("preloaded CPU time ÷ wall ÷ threads", "preloaded_cpu_share"),
    ("load average, 1 min (after loop / after preloaded)", ("load_loop", "load_preloaded")),
    ("completion tokens (loop / preloaded)", ("completion_tokens", "preloaded_completion_tokens")),
    ("step seconds, median (loop)", "step_seconds_median"),
    ("step seconds, median (preloaded)", "preloaded_step_seconds_median"),
    ("intake_wait_s, median", "intake_wait_s_median"),
    ("publish_s, median", "publish_s_median"),
    ("claimable groups, median of samples", "ready_groups_median"),
    ("share of samples with < 1 step claimable", "ready_below_one_step"),
    ("batches rejected / scripted-worker errors", ("batches_rejected", "worker_errors")),
)
STEP_COLUMNS = ("step", "version", "tokens", "step_s", "busy", "intake_wait_s", "publish_s")


def _shown(figures: dict[str, Any], key: str | tuple[str, str]) -> Any:
    if isinstance(key, tuple):
        parts = (_shown(figures, k) for k in key)
        return " / ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in parts)
    value = figures[key]
    return "—" if value is None else value


def print_report(figures: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    modes = list(figures)
    for mode in modes:
        f = figures[mode]
        common.print_table(
            f"{mode} (ASYNCGRPO_LEARNER_OVERLAP={MODES[mode]}); busy: {f['busy_source']}",
            list(STEP_COLUMNS),
            [[_shown(s, k) for k in STEP_COLUMNS] for s in f["per_step"]],
        )
    common.print_table(
        f"Learner pipeline ({args.versions} versions × {args.prompts} prompts × G {args.group}, "
        f"≤ {args.tokens} tokens, {args.threads} torch thread(s), {args.device}; "
        f"{common.CONTENDED}; {common.load_average()})",
        ["figure", *modes],
        [[label, *(_shown(figures[m], key) for m in modes)] for label, key in SUMMARY],
    )
    print("Goal: pipeline efficiency ≥ 0.9 on CPU with the overlap on.")


# -- main ----------------------------------------------------------------------------------------


@dataclass
class Shared:
    """What the scripted workers of every mode share: the tokenizer and the prebuilt pool."""

    tokenizer: Any
    encoder: Any
    fingerprint: str
    pool: Pool


def shared_parts(args: argparse.Namespace) -> Shared:
    from lm.chat import tokenizer_fingerprint
    from lm.models import load_tokenizer
    from worker.prompts import PromptEncoder

    tokenizer: Any = load_tokenizer(common.MODEL)
    # enough completions that no two batches of a run repeat (the admission bound's groups on
    # top of every step's), cycled beyond that
    n = (args.versions + 4) * args.prompts * args.group
    pool = Pool(prebuild(n, LengthMix(args.tokens), len(tokenizer), int(tokenizer.eos_token_id),
                         seed=args.seed))  # fmt: skip
    return Shared(tokenizer, PromptEncoder(tokenizer), str(tokenizer_fingerprint(tokenizer)), pool)


def measure(args: argparse.Namespace, work: Path) -> dict[str, dict[str, Any]]:
    from asyncgrpo.cluster import Cluster

    common.exit_on_sigterm()
    shared = shared_parts(args)
    figures = {}
    with common.postgres_db() as db, moto_process(work, common.S3_KEYS) as moto:
        config = common.bench_cluster(work, db, moto.bucket)
        config.threads = args.threads
        config.learner_env.update({"ASYNCGRPO_LEARNER_SPOT_CHECK_FRACTION": "0",
                                   "ASYNCGRPO_LEARNER_DEVICE": args.device})  # fmt: skip
        with Cluster(config) as cluster:
            cluster.start_server()
            for mode in args.modes:
                loop = run_loop(cluster, db, args, mode, shared)
                load_loop = os.getloadavg()[0]
                pre = preloaded(loop, args, work, mode)
                figures[mode] = mode_figures(loop, pre, args.prompts)
                figures[mode].update(load_loop=load_loop, load_preloaded=os.getloadavg()[0])
                f = figures[mode]
                print(f"{mode}: efficiency {f['pipeline_efficiency']:.3f}, busy median "
                      f"{f['learner_busy_median']}", flush=True)  # fmt: skip
    return figures


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--versions", type=int, default=6, help="versions (= steps) per mode")
    parser.add_argument("--prompts", type=int, default=2, help="prompts (groups) per step")
    parser.add_argument("--group", type=int, default=4, help="G, completions per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="completion length cap")
    parser.add_argument("--max-chars", type=int, default=40,
                        help="length_limit's max_chars (the reward)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the learner")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2, help="scripted worker threads")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--seed", type=int, default=0, help="seed of the prebuilt completions")
    parser.add_argument("--timeout", type=float, default=1800, help="per run, seconds")
    parser.add_argument(
        "--preloaded-repeats", type=int, default=2, help="preloaded trainings (median wall time)"
    )
    parser.add_argument("--train-preloaded", type=Path, help=argparse.SUPPRESS)
    report.add_json_flag(parser)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.train_preloaded is not None:  # the subprocess of `preloaded`
        trained = train_preloaded(
            args.train_preloaded, args.threads, args.device, args.preloaded_repeats
        )
        print(json.dumps(trained))
        return
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        figures = measure(args, Path(tmp))
    print_report(figures, args)
    report.emit(args, {"modes": figures, "versions": args.versions, "prompts": args.prompts,
                       "group": args.group, "tokens": args.tokens, "threads": args.threads,
                       "device": args.device, "load_1min": os.getloadavg()[0]})  # fmt: skip


if __name__ == "__main__":
    main()
