"""`bench/learner.py --ranks 1 2`: the learner's GRPO step (the `ours` variant) data-parallel
over 1, 2, … ranks (learner/distributed.py; gloo on CPU), each count in processes of its own:
one process for 1 rank, `torchrun --standalone --nproc-per-node N` otherwise. The same length
mix as bench/learner.py (module docstring there); `--warmup` untimed steps, `--repeats` timed.

Per rank count: the step's seconds (rank 0, medians), each rank's compute seconds and
all-reduce seconds (waiting for slower ranks included), the communication share (all-reduce
÷ compute: the share of a step spent in communication), tokens/s per rank (its trained
tokens ÷ its compute seconds) and in all (trained tokens ÷ step seconds), and the bytes one
all-reduce sums. On CPU the ranks share the machine's cores, so no speed-up can show; the
communication share is the figure that carries over to GPUs (with NCCL it is smaller still).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import report

SCRIPT = Path(__file__).resolve().parent / "learner.py"
COLLECTIVE_TIMEOUT_S = 600.0  # a benchmark has no lease; a slow rank only slows it


def rank_child(args: argparse.Namespace) -> dict[str, Any] | None:
    """One rank (or the single process): returns the figures on rank 0, None elsewhere."""
    import torch

    from bench.learner import VARIANTS, bench_config, bench_groups
    from learner.distributed import DataParallel, rank_env
    from learner.trainer import Trainer, add_lora
    from lm.models import load_model

    torch.set_num_threads(args.threads)
    env = rank_env()
    dp = None
    if env is not None:
        dp = DataParallel(env, device="cpu", collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    torch.manual_seed(0)
    config = bench_config(args, VARIANTS["ours"])
    model = add_lora(load_model(args.model), config)
    groups = bench_groups(args, model.config.vocab_size)
    trainer = Trainer(model, config, pad_id=0, dp=dp)
    if dp is not None:
        dp.share_trainer_state(trainer)
        if not dp.is_leader:
            _follow(dp, trainer)
            return None
    steps = []
    for i in range(args.warmup + args.repeats):
        metrics = trainer.train_step(groups)
        if i >= args.warmup:
            steps.append((metrics, list(trainer.last_runs)))
    if dp is not None:
        dp.stop(0)
        dp.close()
    grad_bytes = sum(p.numel() * p.element_size() for p in trainer.params)
    return _figures(steps, 1 if dp is None else dp.world_size, grad_bytes)


def _follow(dp: Any, trainer: Any) -> None:
    while True:
        kind, share = dp.receive()
        if kind == "stop":
            break
        trainer.train_share(share)
    dp.close()


def _figures(
    steps: list[tuple[dict[str, float], list[Any]]], ranks: int, grad_bytes: int
) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return float(statistics.median(values))

    out: dict[str, Any] = {
        "ranks": ranks,
        "step_s": med([m["step_seconds"] for m, _ in steps]),
        "trained_tokens": steps[-1][0]["trained_tokens"],
        "tokens_per_s": med([m["trained_tokens"] / m["step_seconds"] for m, _ in steps]),
        "micro_steps_per_rank": steps[-1][0]["micro_batches"],
        "allreduce_bytes": grad_bytes + 4 if ranks > 1 else 0,
    }
    if ranks == 1:
        compute = med([m["compute_s"] for m, _ in steps])
        out["per_rank"] = [
            {"compute_s": compute, "allreduce_s": 0.0, "comm_fraction": 0.0,
             "tokens_per_s": out["trained_tokens"] / compute}
        ]  # fmt: skip
    else:
        out["per_rank"] = [_rank(r, [runs[r] for _, runs in steps]) for r in range(ranks)]
        out["empty_micro_steps"] = steps[-1][0]["empty_micro_steps"]
    out["comm_fraction"] = out["per_rank"][0]["comm_fraction"]
    out["comm_fraction_max"] = max(r["comm_fraction"] for r in out["per_rank"])
    return out


def _rank(rank: int, runs: list[Any]) -> dict[str, float]:
    tokens = [sum(p["tokens"] for p in r.parts) for r in runs]
    return {
        "rank": rank,
        "compute_s": float(statistics.median(r.compute_s for r in runs)),
        "allreduce_s": float(statistics.median(r.allreduce_s for r in runs)),
        "comm_fraction": float(statistics.median(r.allreduce_s / r.compute_s for r in runs)),
        "tokens_per_s": float(
            statistics.median(t / r.compute_s for t, r in zip(tokens, runs, strict=True))
        ),
    }


def _command(ranks: int, argv: list[str]) -> list[str]:
    own = [str(SCRIPT), *argv, "--rank-child", "--json"]
    if ranks == 1:
        return [sys.executable, *own]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, "--nproc-per-node", str(ranks), "--", *own]


def parent(args: argparse.Namespace, argv: list[str]) -> None:
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for ranks in args.ranks:
        started = time.perf_counter()
        proc = subprocess.run(
            _command(ranks, argv), capture_output=True, text=True, check=False, env=env
        )
        if proc.returncode != 0:
            sys.exit(f"{ranks} ranks failed:\n{proc.stderr[-3000:]}")
        lines = [x for x in proc.stdout.strip().splitlines() if x.startswith("{")]
        results.append(json.loads(lines[-1]))
        print(f"  {ranks} rank(s): done in {time.perf_counter() - started:.0f} s", flush=True)
    load = max(load_before, os.getloadavg()[0])
    cores = os.cpu_count() or 1
    label = f"{cores}-core CPU figures (gloo)"
    print(
        f"{label}; {args.prompts} prompts × {args.group} completions, median {args.median}, cap "
        f"{args.tokens}, {args.threads} thread(s) per rank"
    )
    print(
        f"{'ranks':>5}{'step s':>9}{'tok/s':>9}  per rank: compute s / all-reduce s / "
        "comm share / tok/s"
    )
    for r in results:
        per = "  ".join(
            f"[{x['compute_s']:.2f} / {x['allreduce_s']:.3f} / {x['comm_fraction']:.3f} / "
            f"{x['tokens_per_s']:.0f}]"
            for x in r["per_rank"]
        )
        print(f"{r['ranks']:>5}{r['step_s']:>9.2f}{r['tokens_per_s']:>9.0f}  {per}")
    print(
        f"ranks share {cores} cores here: no speed-up can show; the communication share is "
        f"the figure that carries over. Load average up to {load:.1f}"
        f" ({'CONTENDED' if load > cores else 'uncontended'})"
    )
    report.emit(
        args,
        {"label": label, "cores": cores, "threads_per_rank": args.threads, "load_1min": load,
         "prompts": args.prompts, "group": args.group, "median": args.median,
         "cap": args.tokens, "runs": results},
    )  # fmt: skip
