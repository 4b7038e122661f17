"""Learner efficiency: on the same tokens, a plain forward+backward of the model with the LoRA
adapter vs one GRPO learner step (plan, micro-batches, loss, backward, clip, AdamW).

    .venv/bin/python bench/learner.py [--prompts 8] [--group 8] [--tokens 32] [--threads 2] [--json]
    (or .venv/bin/python -m bench.learner ...)

Prints learner efficiency (plain / ours; target >= 0.85), tokens/s and peak RSS. Every group
has mixed rewards, so no group is skipped (skipping would flatter the learner). The plain and
the GRPO runs alternate, so a change in the machine's load hits both alike; the load average is
printed, and the figures are labelled contended when it exceeds the core count.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # a plain script: the repository root, not bench/, on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # (bench/learner.py shadows learner/)

from bench import report  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="completion tokens")
    parser.add_argument("--prompt-tokens", type=int, default=36)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    report.add_json_flag(parser)
    args = parser.parse_args()

    import torch

    from learner.data import Completion, Group, plan_step, step_micro_batches
    from learner.trainer import Trainer, add_lora
    from lm.logprobs import packed_logprobs
    from lm.models import load_model
    from protocol.run_config import RunConfig

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = RunConfig.model_validate(
        {
            "name": "bench",
            "base_model": args.model,
            "dataset": {"kind": "generator"},
            "rewards": [{"name": "numeric_match"}],
            "group_size": args.group,
            "prompts_per_lease": args.prompts,
            "prompts_per_step": args.prompts,
            "sampling": {"max_new_tokens": args.tokens},
            "grpo": {"micro_batch_tokens": args.micro_batch_tokens},
        }
    )
    model = add_lora(load_model(args.model), config)
    vocab = model.config.vocab_size
    groups = []
    for _ in range(args.prompts):
        prompt = torch.randint(10, vocab, (args.prompt_tokens,)).tolist()
        completions = []
        for _ in range(args.group):
            ids = torch.randint(10, vocab, (args.tokens,)).tolist()
            behaviour = (-torch.rand(args.tokens) * 3 - 8).tolist()
            completions.append(Completion(prompt, ids, behaviour))
        rewards = [float(j % 2) for j in range(args.group)]
        groups.append(Group(completions, rewards))
    trainer = Trainer(model, config, pad_id=0)
    plan = plan_step(
        groups,
        loss_type="dapo",
        scale_rewards="group",
        max_completion_tokens=args.tokens,
        skip_zero_advantage=True,
    )
    micro = step_micro_batches(plan, args.micro_batch_tokens, pad_id=0)

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        for mb in micro:
            packed_logprobs(model, mb.packed, 1.0).sum().backward()

    def ours() -> None:
        trainer.train_step(groups)

    print(f"warm-up: {len(micro)} micro-batches of {plan.n_completions} sequences", flush=True)
    plain()  # warm-up
    ours()
    load_before = os.getloadavg()[0]
    runs: dict[str, list[float]] = {"plain": [], "ours": []}
    for _ in range(args.repeats):
        for name, fn in (("plain", plain), ("ours", ours)):
            start = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - start)
            print(f"  {name}: {runs[name][-1]:.2f} s", flush=True)
    load = max(load_before, os.getloadavg()[0])
    t_plain, t_ours = statistics.median(runs["plain"]), statistics.median(runs["ours"])
    tokens = plan.n_completion_tokens
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"sequences {plan.n_completions}, completion tokens {tokens}, micro-batches {len(micro)}")
    print(f"plain forward+backward: {t_plain:.3f} s ({tokens / t_plain:.0f} completion tok/s)")
    print(f"GRPO learner step:      {t_ours:.3f} s ({tokens / t_ours:.0f} completion tok/s)")
    print(f"learner efficiency (plain / ours): {t_plain / t_ours:.3f} (target >= 0.85)")
    print(f"peak RSS: {peak_gb:.2f} GB")
    cores = os.cpu_count() or 1
    label = "CONTENDED" if load > cores else "uncontended"
    print(
        f"load average (1 min) up to {load:.1f} on {cores} cores: {label}; threads {args.threads}"
    )
    report.emit(
        args,
        {
            "sequences": plan.n_completions,
            "completion_tokens": tokens,
            "micro_batches": len(micro),
            "plain_s": t_plain,
            "ours_s": t_ours,
            "plain_tokens_per_s": tokens / t_plain,
            "ours_tokens_per_s": tokens / t_ours,
            "learner_efficiency": t_plain / t_ours,
            "peak_rss_gb": peak_gb,
            "load_1min": load,
            "cores": cores,
            "threads": args.threads,
        },  # fmt: skip
    )


if __name__ == "__main__":
    main()
