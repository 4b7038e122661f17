"""The learner's GRPO step on a long-tailed length mix: padding, peak memory, tokens/s and
learner efficiency, today's path against the old one, each in its own process.

    .venv/bin/python bench/learner.py [--prompts 8] [--group 8] [--tokens 512] [--median 128]
        [--sigma 0.75] [--prompt-tokens 48] [--micro-batch-tokens 4096] [--repeats 3]
        [--warmup 1] [--no-plain] [--threads 2] [--variants baseline,ours,checkpointed] [--json]
    .venv/bin/python bench/learner.py --ranks 1 2 [--threads 1] [the length-mix options] [--json]
    (or .venv/bin/python -m bench.learner ...)

`--ranks`: the data-parallel learner step instead (bench/learner_ranks.py).

Length mix (seeded, `--seed`): `--prompts` prompts, each of a length drawn uniformly from
[prompt_tokens / 2, 2 × prompt_tokens], each with `--group` completions whose lengths are
lognormal — median `--median`, sigma `--sigma` (of the log) — rounded, at least 1 and capped
at `--tokens`; `--sigma 0 --median N` gives every completion N tokens. Rewards alternate 1, 0
within a group, so no group is skipped (skipping would flatter the learner).

Variants, each run in a subprocess of its own (peak RSS is a per-process high-water mark):
  baseline      in-order micro-batches and whole-logits log-probs (the learner before issue 16)
  ours          length-bucketed micro-batches, log-probs through the LM head in chunks
  checkpointed  ours with grpo.gradient_checkpointing (decoder layers recomputed in backward)
Each child: `--warmup` untimed steps, `--repeats` timed steps (the median of their compute_s),
the peak RSS after them, then, unless `--no-plain`, `--repeats` plain forward+backward passes on
the same tokens, written without the learner's code: per sequence, model(ids).logits →
log_softmax → gather the completion tokens → sum → backward, without checkpointing. Learner
efficiency = plain ÷ GRPO step (target ≥ 0.9). The parent prints the variants side by side and
the ratios against the baseline (peak memory target at 8 × 8 × 512: ≤ 0.5).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):  # a plain script: the repository root, not bench/, on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # (bench/learner.py shadows learner/)

from bench import report  # noqa: E402


class Variant(NamedTuple):
    bucket_by_length: bool
    chunk_positions: int | None
    checkpointing: bool


VARIANTS = {
    "baseline": Variant(bucket_by_length=False, chunk_positions=None, checkpointing=False),
    "ours": Variant(bucket_by_length=True, chunk_positions=64, checkpointing=False),
    "checkpointed": Variant(bucket_by_length=True, chunk_positions=64, checkpointing=True),
}


def length_mix(args: argparse.Namespace) -> list[tuple[int, list[int]]]:
    """(prompt length, completion lengths) per prompt, as the module docstring says."""
    rng = random.Random(args.seed)
    mix = []
    for _ in range(args.prompts):
        prompt = rng.randint(max(1, args.prompt_tokens // 2), 2 * args.prompt_tokens)
        lengths = []
        for _ in range(args.group):
            drawn = math.exp(rng.gauss(math.log(args.median), args.sigma))
            lengths.append(min(args.tokens, max(1, round(drawn))))
        mix.append((prompt, lengths))
    return mix


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bench_config(args: argparse.Namespace, variant: Variant) -> Any:
    """The run config of the benchmark's steps."""
    from protocol.run_config import RunConfig

    return RunConfig.model_validate(
        {
            "name": "bench",
            "base_model": args.model,
            "dataset": {"kind": "generator"},
            "rewards": [{"name": "numeric_match"}],
            "group_size": args.group,
            "prompts_per_lease": args.prompts,
            "prompts_per_step": args.prompts,
            "sampling": {"max_new_tokens": args.tokens},
            "grpo": {
                "micro_batch_tokens": args.micro_batch_tokens,
                "gradient_checkpointing": variant.checkpointing,
            },
        }
    )


def bench_groups(args: argparse.Namespace, vocab: int) -> list[Any]:
    """The step's groups: random token ids of the length mix (torch's seeded generator)."""
    import torch

    from learner.data import Completion, Group

    groups = []
    for prompt_len, lengths in length_mix(args):
        prompt = torch.randint(10, vocab, (prompt_len,)).tolist()
        completions = []
        for n in lengths:
            ids = torch.randint(10, vocab, (n,)).tolist()
            completions.append(Completion(prompt, ids, (-torch.rand(n) * 3 - 8).tolist()))
        groups.append(Group(completions, [float(j % 2) for j in range(args.group)]))
    return groups


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from learner.trainer import Trainer, add_lora
    from lm.models import load_model

    variant = VARIANTS[args.variant]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = bench_config(args, variant)
    model = add_lora(load_model(args.model), config)
    groups = bench_groups(args, model.config.vocab_size)
    trainer = Trainer(
        model,
        config,
        pad_id=0,
        bucket_by_length=variant.bucket_by_length,
        chunk_positions=variant.chunk_positions,
    )
    with torch.no_grad():  # touch every weight, so the step's own memory can be told apart
        model(input_ids=torch.tensor([[11, 12]]), use_cache=False)
    rss_loaded = _rss_bytes()
    for _ in range(args.warmup):
        trainer.train_step(groups)
    steps = [trainer.train_step(groups) for _ in range(args.repeats)]
    peak = steps[-1]["peak_memory_bytes"]
    tokens = int(steps[-1]["completion_tokens"])
    compute_s = statistics.median(s["compute_s"] for s in steps)
    out = {
        "variant": args.variant,
        "completion_tokens": tokens,
        "positions": sum(
            len(c.prompt_ids) + len(c.completion_ids) for g in groups for c in g.completions
        ),  # fmt: skip
        "micro_batches": steps[-1]["micro_batches"],
        "padding_fraction": steps[-1]["padding_fraction"],
        "compute_s": compute_s,
        "compute_runs_s": [s["compute_s"] for s in steps],
        "tokens_per_s": tokens / compute_s,
        "peak_rss_bytes": peak,
        "rss_after_load_bytes": rss_loaded,
        "step_peak_above_load_bytes": peak - rss_loaded,
    }
    if not args.no_plain:
        plain_runs = [plain_pass(model, groups) for _ in range(args.repeats)]
        out["plain_s"] = statistics.median(plain_runs)
        out["plain_runs_s"] = plain_runs
        out["learner_efficiency"] = out["plain_s"] / compute_s
    return out


def plain_pass(model: Any, groups: list[Any]) -> float:
    """One plain forward+backward over every sequence, one at a time (no padding, no
    micro-batching, no chunking, no checkpointing); seconds."""
    import torch

    model.eval()  # also turns the decoder layers' checkpointing off
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    for g in groups:
        for c in g.completions:
            ids = torch.tensor([list(c.prompt_ids) + list(c.completion_ids)])
            n = len(c.completion_ids)
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=n + 1).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), dim=-1)
            target = torch.tensor([list(c.completion_ids)])
            logp.gather(2, target.unsqueeze(-1)).sum().backward()
    return time.perf_counter() - start


def parent(args: argparse.Namespace, argv: list[str]) -> None:
    results: dict[str, dict[str, Any]] = {}
    load_before = os.getloadavg()[0]
    for name in args.variants.split(","):
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--variant", name, "--json"]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"variant {name} failed:\n{proc.stderr[-3000:]}")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"  {name}: done in {time.perf_counter() - started:.0f} s", flush=True)
    load = max(load_before, os.getloadavg()[0])
    first = next(iter(results.values()))
    print(
        f"{args.prompts} prompts × {args.group} completions, lognormal median {args.median}, "
        f"sigma {args.sigma}, cap {args.tokens}: {first['completion_tokens']} completion tokens, "
        f"{first['positions']} positions; micro-batch budget {args.micro_batch_tokens}"
    )
    header = f"{'variant':<13}{'mbs':>5}{'padding':>9}{'compute s':>11}{'tok/s':>8}"
    print(header + f"{'peak GB':>9}{'+step GB':>10}{'plain s':>9}{'efficiency':>12}")
    for name, r in results.items():
        plain = f"{r['plain_s']:>9.2f}{r['learner_efficiency']:>12.3f}" if "plain_s" in r else ""
        print(
            f"{name:<13}{r['micro_batches']:>5.0f}{r['padding_fraction']:>9.3f}"
            f"{r['compute_s']:>11.2f}{r['tokens_per_s']:>8.0f}{r['peak_rss_bytes'] / 1e9:>9.2f}"
            f"{r['step_peak_above_load_bytes'] / 1e9:>10.2f}{plain}"
        )
    ratios: dict[str, dict[str, float]] = {}
    if "baseline" in results:
        base = results["baseline"]
        for name, r in results.items():
            if name == "baseline":
                continue
            ratios[name] = {
                "peak_rss_vs_baseline": r["peak_rss_bytes"] / base["peak_rss_bytes"],
                "step_peak_vs_baseline": r["step_peak_above_load_bytes"]
                / max(base["step_peak_above_load_bytes"], 1),
                "speedup_vs_baseline": base["compute_s"] / r["compute_s"],
            }
            q = ratios[name]
            print(
                f"{name} / baseline: peak RSS {q['peak_rss_vs_baseline']:.2f}× (target ≤ 0.5 "
                f"at 8×8×512), step's peak above the loaded model "
                f"{q['step_peak_vs_baseline']:.2f}×, speed {q['speedup_vs_baseline']:.2f}×"
            )
    cores = os.cpu_count() or 1
    label = "CONTENDED" if load > cores else "uncontended"
    print(
        f"load average (1 min) up to {load:.1f} on {cores} cores: {label}; threads {args.threads}"
    )
    report.emit(
        args,
        {"variants": results, "ratios": ratios, "load_1min": load, "cores": cores,
         "threads": args.threads, "median": args.median, "sigma": args.sigma,
         "cap": args.tokens, "prompts": args.prompts, "group": args.group,
         "micro_batch_tokens": args.micro_batch_tokens},
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512, help="completion length cap")
    parser.add_argument("--median", type=float, default=128, help="median completion length")
    parser.add_argument("--sigma", type=float, default=0.75, help="sigma of log(length)")
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-plain", action="store_true", help="skip the plain passes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default="baseline,ours,checkpointed")
    parser.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        help="Data-parallel instead: the `ours` step over each of these numbers of ranks "
        "(gloo on CPU; bench/learner_ranks.py); --threads is then per rank.",
    )
    parser.add_argument("--rank-child", action="store_true", help=argparse.SUPPRESS)
    report.add_json_flag(parser)
    args = parser.parse_args()
    if args.rank_child or args.ranks:
        from bench import learner_ranks

        if args.rank_child:
            figures = learner_ranks.rank_child(args)
            if figures is not None:  # rank 0 (or a single process)
                report.emit(args, figures)
            return
        learner_ranks.parent(args, _without_ranks(sys.argv[1:]))
        return
    if args.variant:
        report.emit(args, child(args))
        return
    argv = [a for a in sys.argv[1:] if a != "--json"]
    parent(args, argv)


def _without_ranks(argv: list[str]) -> list[str]:
    """The command line for the rank children: no --ranks N…, no --json."""
    out, skipping = [], False
    for a in argv:
        if a == "--ranks":
            skipping = True
            continue
        if skipping and a.isdigit():
            continue
        skipping = False
        if a != "--json":
            out.append(a)
    return out


if __name__ == "__main__":
    main()
