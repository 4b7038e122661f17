"""GPU check: the whole system on one GPU with a model of Qwen2.5-1.5B's shape and RANDOM
weights, in a few minutes. The figures say how fast the parts run, nothing about learning.

    python bench/gpu_check.py [--versions 10] [--max-new-tokens 256] [--peak-tflops T] [--json]
    python bench/gpu_check.py --smoke [--json]      # CPU, a tiny model of the same vocabulary

What runs (asyncgrpo/cluster.py, as `asyncgrpo demo`): the embedded control plane (SQLite, a
local bucket folder), one rollout worker (transformers backend) and the learner, each its own
process, on `--device` in `--dtype`. The model folder is written first: a Qwen2 config with
Qwen2.5-1.5B's hyper-parameters (`SHAPES`), random bf16 weights (`save_pretrained`), and the
small model's tokenizer files (SmolLM2's, 49,152 tokens, copied verbatim: both processes load
the same folder, so their tokenizer fingerprints agree). The model's 151,936 embedding rows
outnumber the tokenizer's ids, and random weights would sample the ids past the tokenizer two
times in three (batches carrying them are rejected as invalid): generation_config.json lists
those ids as `suppress_tokens`, which generate() adds to the worker's settings. The reward is
the built-in `hash_score` (a fixed pseudo-random score of the completion text): a correctness
reward would score every completion of random weights alike, and all-equal groups are skipped.

Printed (and with --json, one JSON object as the last line):
  generation tokens/s  completion tokens of the worker's batches ÷ the time at least one of its
                       leases was generating (the union of [end − generation_seconds, end]);
                       batches that started before the first one ended (warm-up) left out
  learner tokens/s     positions through the model (prompt + completion tokens of the trained
                       sequences) ÷ the learner's step time, steps after the first
  MFU                  model FLOPs of those steps ÷ (their step time × the GPU's dense bf16 peak):
                       FLOPs = 4·N_body·P + 4·N_head·C + 6·N_lora·P, where P = positions,
                       C = completion tokens, N_body = weights of the decoder layers' linear
                       maps, N_head = vocab × hidden (the tied output projection, which runs
                       on completion positions only), N_lora = the adapter's weights. The base
                       is frozen: its forward (2N) and the backward to the activations (2N) run,
                       no weight gradients; the adapter has all three (6N). Attention scores,
                       norms and recomputation (the head's chunks are recomputed in the
                       backward) are not counted. Peak: PEAK_BF16_TFLOPS by GPU name, or
                       --peak-tflops
  learner_busy         the learner's own per-step metric (median), null where it posts none
  peak memory          the learner's `peak_memory_bytes` metric (max); per process, the most
                       GPU memory nvidia-smi saw it hold (sampled every 2 s), null without it
  sync latency         from the learner's "published version N" log line to the worker's first
                       "generating with … vN" line (p50, max), versions that were generated with
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncgrpo.cluster import Cluster  # noqa: E402
from bench import common, report  # noqa: E402
from tests.harness.runs import arithmetic  # noqa: E402
from tests.harness.runs import run_config as harness_run_config  # noqa: E402
from tests.harness.stack import (  # noqa: E402
    FAST_LEARNER_ENV,
    FAST_SERVER_ENV,
    FAST_WORKER_ENV,
    cluster_config,
)

BANNER = (
    "RANDOM WEIGHTS: every figure below is about speed only (tokens/s, MFU, memory, latency); "
    "rewards and losses mean nothing."
)
SHAPES: dict[str, dict[str, Any]] = {
    # Qwen2.5-1.5B's config.json hyper-parameters
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
    },
    # --smoke: the same vocabulary and layout, tiny enough for two CPU cores
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
    },
}
# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity), matched in this order against
# torch.cuda.get_device_name(); "H100 PCIe" before "H100" (SXM).
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("A100", 312.0),
    ("L4", 121.0),
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
SYSTEM_PROMPT = "You are a helpful assistant."
LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# -- the model folder ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCounts:
    """Weights that the FLOPs formula counts (module docstring)."""

    body: int  # linear maps of the decoder layers
    head: int  # vocab × hidden
    total: int  # every parameter


def default_tokenizer_dir() -> Path:
    """The tokenizer files carried to a GPU box (scripts/gpu_wheels.sh), else the small
    model's converted folder (lm/models.py)."""
    carried = Path(__file__).resolve().parents[1] / ".gpu_wheels" / "tokenizer"
    if (carried / "tokenizer.json").is_file():
        return carried
    from lm.models import resolve_model

    return Path(resolve_model(common.MODEL))


def copy_tokenizer(source: Path, dest: Path) -> int:
    """Copy the tokenizer files verbatim; returns how many ids the tokenizer can produce."""
    from transformers import AutoTokenizer

    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
    return len(AutoTokenizer.from_pretrained(dest))


def write_model_folder(
    dest: Path, shape: dict[str, Any], dtype: str, tokenizer: Path
) -> ModelCounts:
    """A Qwen2 model of `shape` with random weights, saved in `dtype`, plus the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    dest.mkdir(parents=True)
    n_tokens = copy_tokenizer(tokenizer, dest)
    if n_tokens > shape["vocab_size"]:
        raise ValueError(f"the tokenizer's {n_tokens} ids exceed the model's vocabulary")
    tok = AutoTokenizer.from_pretrained(dest)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    config = Qwen2Config(
        **shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=pad
    )
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)  # random init of 1.5 B weights on the host
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    # ids the tokenizer cannot produce nor decode: never sampled (module docstring)
    model.generation_config.suppress_tokens = list(range(n_tokens, shape["vocab_size"]))
    model.save_pretrained(dest)
    counts = count_weights(model, shape)
    del model
    return counts


def count_weights(model: Any, shape: dict[str, Any]) -> ModelCounts:
    body = sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if ".layers." in name and name.rsplit(".", 1)[-1] in LINEAR
    )
    head = shape["vocab_size"] * shape["hidden_size"]
    return ModelCounts(body=body, head=head, total=sum(p.numel() for p in model.parameters()))


def lora_weights(shape: dict[str, Any], rank: int, targets: list[str]) -> int:
    """A (r × in) + B (out × r) per targeted linear map of every layer."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    in_out = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip
    per_layer = sum(rank * (in_out[t][0] + in_out[t][1]) for t in targets)
    return int(per_layer * shape["num_hidden_layers"])


# -- the run -------------------------------------------------------------------------------------


def run_config(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    return harness_run_config(
        name="gpu-check",
        base_model=str(model_dir),
        dataset=arithmetic(args.versions * args.prompts_per_step * 2),
        rewards=[{"name": "hash_score", "weight": 1.0, "kwargs": {}}],
        lora={
            "rank": args.lora_rank,
            "alpha": 2.0 * args.lora_rank,
            "dropout": 0.0,
            "target_modules": args.lora_targets,
        },  # fmt: skip
        grpo={
            "learning_rate": 1e-5,
            "spot_check_fraction": 0.0,
            "micro_batch_tokens": args.micro_batch_tokens,
            "system_prompt": SYSTEM_PROMPT,
        },
        sampling={"temperature": 1.0, "max_new_tokens": args.max_new_tokens},
        group_size=args.group_size,
        prompts_per_lease=args.prompts_per_lease,
        prompts_per_step=args.prompts_per_step,
        max_staleness=2,
        max_versions=args.versions,
        lease_ttl_s=300.0,
        heartbeat_interval_s=5.0,
    )


def prompt_tokens(config: dict[str, Any], model_dir: Path) -> tuple[float, bool]:
    """Prompt length in tokens as worker and learner encode it: (mean, all rows equal). The
    arithmetic prompts ("What is 45 + 98? …", digits one token each) are all one length."""
    from lm.chat import encode_prompt
    from lm.models import load_tokenizer
    from protocol.datasets import generate

    tokenizer = load_tokenizer(str(model_dir))
    data = config["dataset"]
    lengths = [
        len(encode_prompt(tokenizer, row["prompt"], SYSTEM_PROMPT))
        for row in generate(data["generator"], data["size"], data["seed"])
    ]
    return sum(lengths) / len(lengths), len(set(lengths)) == 1


class GpuMemory(threading.Thread):
    """The most GPU memory nvidia-smi saw each process hold (bytes), sampled every 2 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="gpu-memory")
        self.peak: dict[int, int] = {}
        self.stopped = threading.Event()
        self.available = shutil.which("nvidia-smi") is not None

    def run(self) -> None:
        while self.available and not self.stopped.wait(2.0):
            self.sample()

    def sample(self) -> None:
        query = [
            "nvidia-smi",
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ]
        try:
            out = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return
        for line in out.splitlines():
            pid, _, mib = line.partition(",")
            if pid.strip().isdigit() and mib.strip().isdigit():
                used = int(mib) * common.MB
                self.peak[int(pid)] = max(self.peak.get(int(pid), 0), used)

    def of(self, pid: int) -> int | None:
        return self.peak.get(pid)


@dataclass
class Outcome:
    run_id: str
    status: str
    versions: int
    wall_s: float
    logs: dict[str, str] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    batches: list[tuple[int, float, float]] = field(default_factory=list)  # tokens, start, end
    gpu_memory: dict[str, int | None] = field(default_factory=dict)


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        **FAST_WORKER_ENV,
        "ASYNCGRPO_WORKER_DEVICE": args.device,
        "ASYNCGRPO_WORKER_DTYPE": args.dtype,
        "ASYNCGRPO_WORKER_MAX_BATCH_SEQUENCES": str(args.batch_sequences),
    }


def learner_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        **FAST_LEARNER_ENV,
        "ASYNCGRPO_LEARNER_DEVICE": args.device,
        "ASYNCGRPO_LEARNER_DTYPE": args.dtype,
    }


def run_cluster(args: argparse.Namespace, work: Path, model_dir: Path, deadline: float) -> Outcome:
    config = cluster_config(
        work / "cluster",
        model=str(model_dir),
        server_env=FAST_SERVER_ENV,
        worker_env=worker_env(args),
        learner_env=learner_env(args),
    )
    cluster = Cluster(config)
    memory = GpuMemory()
    started = time.monotonic()
    with cluster:
        cluster.start_server()
        run_id = cluster.create_run(run_config(args, model_dir))
        worker = cluster.start_worker("gpu-worker")
        learner = cluster.start_learner()
        memory.start()
        status = wait_finished(cluster, run_id, deadline)
        memory.stopped.set()
        memory.sample()
        assert cluster.admin is not None
        run = cluster.admin.get_run(run_id)
        metrics = cluster.admin.run_metrics(run_id)
        outcome = Outcome(
            run_id=run_id,
            status=status,
            versions=int(run["current_version"]),
            wall_s=time.monotonic() - started,
            metrics=list(metrics["learner"]),
            rejected=dict(metrics["proxy"]["rejected_by_reason"]),
            batches=batch_intervals(cluster.database_url, run_id),
            gpu_memory={"worker": memory.of(worker.pid), "learner": memory.of(learner.pid)},
        )
    outcome.logs = {"worker": worker.log_text(), "learner": learner.log_text()}
    return outcome


def wait_finished(cluster: Cluster, run_id: str, deadline: float) -> str:
    """The run's status once it ends, or "deadline" (what was reached is still reported)."""
    assert cluster.admin is not None
    while time.monotonic() < deadline:
        status = str(cluster.admin.get_run(run_id)["status"])
        if status not in ("pending", "running"):
            return status
        for proc in (cluster.learner, *cluster.workers.values()):
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.log_text()[-4000:]}")
        time.sleep(1.0)
    return "deadline"


def batch_intervals(database_url: str, run_id: str) -> list[tuple[int, float, float]]:
    """(completion tokens, generation start, end) of each batch the worker uploaded."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from server.models.lease import RolloutBatch

    engine = create_engine(database_url)
    try:
        with Session(engine) as session:
            rows = session.execute(
                select(
                    RolloutBatch.n_tokens, RolloutBatch.generation_seconds, RolloutBatch.created_at
                ).where(RolloutBatch.run_id == uuid.UUID(run_id))
            ).all()
    finally:
        engine.dispose()
    out = []
    for tokens, seconds, created in rows:
        end = created.timestamp()
        out.append((int(tokens), end - float(seconds or 0.0), end))
    return sorted(out, key=lambda b: b[1])


# -- figures -------------------------------------------------------------------------------------


def generation_figures(batches: list[tuple[int, float, float]]) -> dict[str, Any]:
    if not batches:
        return {"generation_tokens_per_s": None, "generated_tokens": 0, "batches_measured": 0}
    first_end = min(end for _t, _s, end in batches)
    steady = [b for b in batches if b[1] >= first_end] or batches
    window = common.Window(min(s for _t, s, _e in steady), max(e for _t, _s, e in steady))
    busy = common.union_overlap([(s, e) for _t, s, e in steady], window)
    tokens = sum(t for t, _s, _e in steady)
    return {
        "generation_tokens_per_s": tokens / busy if busy > 0 else None,
        "generated_tokens": sum(t for t, _s, _e in batches),
        "batches_measured": len(steady),
    }


def learner_figures(
    points: list[dict[str, Any]],
    *,
    prompt_len: float,
    group_size: int,
    counts: ModelCounts,
    lora: int,
    peak_tflops: float | None,
) -> dict[str, Any]:
    steps = sorted((p for p in points if "step_seconds" in p["values"]), key=lambda p: p["step"])
    measured = steps[1:] or steps  # the first step carries the device's warm-up
    positions = completions = 0.0
    seconds = 0.0
    for point in measured:
        v = point["values"]
        trained_groups = v.get("groups", 0.0) * (1.0 - v.get("zero_advantage_fraction", 0.0))
        completion_tokens = float(v.get("trained_tokens") or 0.0)
        positions += round(trained_groups) * group_size * prompt_len + completion_tokens
        completions += completion_tokens
        seconds += float(v["step_seconds"])
    flops = 4 * counts.body * positions + 4 * counts.head * completions + 6 * lora * positions
    mfu = flops / (seconds * peak_tflops * 1e12) if seconds > 0 and peak_tflops else None
    return {
        "learner_steps": len(steps),
        "learner_steps_measured": len(measured),
        "learner_tokens_per_s": positions / seconds if seconds > 0 else None,
        "learner_step_s_p50": _median([float(p["values"]["step_seconds"]) for p in measured]),
        "model_tflop_per_s": flops / seconds / 1e12 if seconds > 0 else None,
        "mfu": mfu,
        "learner_busy_p50": _median(_series(measured, "learner_busy")),
        "padding_fraction_p50": _median(_series(measured, "padding_fraction")),
        "learner_peak_memory_bytes": _max(_series(steps, "peak_memory_bytes")),
    }


def sync_latencies(worker_log: str, learner_log: str, run_id: str) -> list[float]:
    """Seconds from "published version N" to the worker's first generation with N."""
    out = []
    for line in learner_log.splitlines():
        found = common.log_stamp(r"published version (\d+)", line)
        if found is None:
            continue
        generating_at = common.first_generation(worker_log, run_id, int(found.group(2)))
        if generating_at is not None:
            out.append(generating_at - common.log_time(found.group(1)))
    return out


def _series(points: list[dict[str, Any]], name: str) -> list[float]:
    return [float(p["values"][name]) for p in points if p["values"].get(name) is not None]


def _median(values: list[float]) -> float | None:
    return common.median(values) if values else None


def _max(values: list[float]) -> int | None:
    return int(max(values)) if values else None


def peak_for(device_name: str | None, override: float | None) -> float | None:
    if override is not None:
        return override
    for key, tflops in PEAK_BF16_TFLOPS:
        if device_name and key in device_name:
            return tflops
    return None


def device_name(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return str(torch.cuda.get_device_name(torch.device(device)))


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage="gpu_check.py [--smoke] [--versions N] [--peak-tflops T] [--json]",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU, the tiny shape, 2 versions: checks the script, not a GPU",
    )
    parser.add_argument("--device", default=None, help="cuda (default) or cpu (--smoke)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--versions", type=int, default=None, help="10; --smoke 2")
    parser.add_argument("--group-size", type=int, default=None, help="G: 8; --smoke 4")
    parser.add_argument("--prompts-per-lease", type=int, default=None, help="8; --smoke 2")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="8; --smoke 2")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="256; --smoke 16")
    parser.add_argument(
        "--batch-sequences",
        type=int,
        default=None,
        help="the worker's forward batch: 128 (two leases); --smoke 8",
    )
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--lora-rank", type=int, default=None, help="16; --smoke 4")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's dense bf16 peak (default: PEAK_BF16_TFLOPS by name)",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="stop and report what was reached: 420 (7 min); --smoke 150",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer folder (default: .gpu_wheels/tokenizer, else the small model's)",
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the files here")
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    full = {"device": "cuda", "versions": 10, "group_size": 8, "prompts_per_lease": 8,
            "prompts_per_step": 8, "max_new_tokens": 256, "batch_sequences": 128,
            "lora_rank": 16, "deadline_s": 420.0}  # fmt: skip
    smoke = {"device": "cpu", "versions": 2, "group_size": 4, "prompts_per_lease": 2,
             "prompts_per_step": 2, "max_new_tokens": 16, "batch_sequences": 8,
             "lora_rank": 4, "deadline_s": 150.0}  # fmt: skip
    for name, value in (smoke if args.smoke else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.shape = "tiny" if args.smoke else "qwen2.5-1.5b"
    args.lora_targets = ["q_proj", "v_proj"] if args.smoke else LINEAR
    return args


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    shape = SHAPES[args.shape]
    model_dir = work / "model"
    counts = write_model_folder(
        model_dir, shape, args.dtype, args.tokenizer or default_tokenizer_dir()
    )
    build_s = time.monotonic() - t0
    print(f"model folder ({args.shape}, {counts.total / 1e9:.3f} B weights, {args.dtype}, random) "
          f"written in {build_s:.1f}s", flush=True)  # fmt: skip
    prompt_len, exact = prompt_tokens(run_config(args, model_dir), model_dir)
    outcome = run_cluster(args, work, model_dir, t0 + args.deadline_s)
    name = device_name(args.device)
    peak = peak_for(name, args.peak_tflops)
    lora = lora_weights(shape, args.lora_rank, args.lora_targets)
    latencies = sync_latencies(outcome.logs["worker"], outcome.logs["learner"], outcome.run_id)
    figures: dict[str, Any] = {
        "random_weights": True,
        "mode": "smoke" if args.smoke else "gpu",
        "device": args.device,
        "device_name": name,
        "dtype": args.dtype,
        "shape": args.shape,
        "weights": counts.total,
        "lora_weights": lora,
        "run_status": outcome.status,
        "versions_asked": args.versions,
        "versions_reached": outcome.versions,
        "prompt_tokens": prompt_len,
        "prompt_tokens_exact": exact,
        "max_new_tokens": args.max_new_tokens,
        "rejected_batches": outcome.rejected,
        **generation_figures(outcome.batches),
        **learner_figures(
            outcome.metrics,
            prompt_len=prompt_len,
            group_size=args.group_size,
            counts=counts,
            lora=lora,
            peak_tflops=peak,
        ),  # fmt: skip
        "peak_tflops": peak,
        "worker_gpu_memory_max_bytes": outcome.gpu_memory.get("worker"),
        "learner_gpu_memory_max_bytes": outcome.gpu_memory.get("learner"),
        "sync_latency_s_p50": _median(latencies),
        "sync_latency_s_max": max(latencies) if latencies else None,
        "sync_versions": len(latencies),
        "build_s": build_s,
        "wall_s": time.monotonic() - t0,
    }
    return figures


def print_report(f: dict[str, Any]) -> None:
    print(f"\n{BANNER}")
    rows = [
        ["generation tokens/s", _fmt(f["generation_tokens_per_s"]),
         f"{f['batches_measured']} batches, {f['generated_tokens']} tokens in all"],
        ["learner tokens/s", _fmt(f["learner_tokens_per_s"]),
         f"{f['learner_steps_measured']} steps; step p50 {_fmt(f['learner_step_s_p50'])} s"],
        ["MFU", _fmt(f["mfu"]),
         f"{_fmt(f['model_tflop_per_s'])} TFLOP/s of {_fmt(f['peak_tflops'])} peak"],
        ["learner_busy p50", _fmt(f["learner_busy_p50"]), "the learner's metric"],
        ["learner peak memory GiB", _gib(f["learner_peak_memory_bytes"]),
         f"nvidia-smi: learner {_gib(f['learner_gpu_memory_max_bytes'])}, "
         f"worker {_gib(f['worker_gpu_memory_max_bytes'])}"],
        ["sync latency p50 s", _fmt(f["sync_latency_s_p50"]),
         f"max {_fmt(f['sync_latency_s_max'])}, {f['sync_versions']} versions"],
    ]  # fmt: skip
    common.print_table(
        f"GPU check: {f['shape']} on {f['device_name'] or f['device']} ({f['dtype']}), "
        f"{f['versions_reached']}/{f['versions_asked']} versions, run {f['run_status']}, "
        f"{f['wall_s']:.0f} s",
        ["figure", "value", "note"],
        rows,
    )
    if f["rejected_batches"]:
        print(f"rejected batches by reason: {f['rejected_batches']}")
    if "invalid" in f["rejected_batches"]:
        print(
            "INVALID BATCHES: the learner's log says which check; ids past the tokenizer's "
            "would mean this transformers ignored generation_config.json's suppress_tokens"
        )
    print(BANNER, flush=True)


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"


def _gib(value: int | None) -> str:
    return "null" if value is None else f"{value / 1024**3:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(BANNER, flush=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every file is local; a GPU box has no network
    common.exit_on_sigterm()
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        figures = measure(args, args.work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            figures = measure(args, Path(tmp))
    print_report(figures)
    report.emit(args, figures)
    return 0 if figures["versions_reached"] >= args.versions else 1


if __name__ == "__main__":
    sys.exit(main())
