"""Asynchronous vs synchronous GRPO with two workers of unequal speed.

The whole system runs (asyncgrpo/cluster.py): control plane on Postgres, moto S3 in its own
process, a learner (`asyncgrpo learner`) and two rollout workers (transformers on CPU), one of
them ("slow") throttled to a third of wall time by a SIGSTOP/SIGCONT duty cycle (bench/common.py
Throttle — what `cpulimit` does). The same tiny arithmetic run (G = 4, 1 prompt per lease,
2 per step, 16 new tokens, LoRA r = 4) is trained to a fixed number of versions at
max_staleness 0 (synchronous GRPO: the admission bound holds one step of groups, so a step
waits for the slow worker and the workers wait for the learner), 2 and 4.

Figures cover the steady state, from the publish of version 1 to that of the last version:
samples/hour = completions trained into versions 2..N per hour; reward/min = Σ reward of those
completions per wall-clock minute (correct answers per minute for the 0/1 arithmetic reward);
mean reward is their mean. The ratio is samples/hour over the max_staleness 0 run.

This machine has 2 cores shared with other engineers' test runs: the server, moto and the
learner are pinned to CPU 0 and both workers to CPU 1 (taskset), so no process has a core of
its own, and every figure is CPU-contended. Published: AReaL 2.77× over synchronous RL,
PipelineRL ~2× (large GPU clusters).

    .venv/bin/python bench/async_vs_sync.py [--versions 8] [--staleness 0 2 4] [--json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, report  # noqa: E402
from tests.harness.runs import run_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=8)
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 2, 4])
    parser.add_argument("--slow-duty", type=float, default=1 / 3)
    report.add_json_flag(parser)
    args = parser.parse_args()
    layout = common.Layout(slow_duty=args.slow_duty)
    configs = [
        run_config(
            common.SWEEP_RUN, name=f"bench-async-s{s}", max_versions=args.versions, max_staleness=s
        )
        for s in args.staleness
    ]
    figures = common.sweep(configs, layout)
    base = figures[0].samples_per_hour if figures and args.staleness[0] == 0 else None
    records = [
        {
            "max_staleness": s, "versions": f.versions, "window_s": f.window_s,
            "samples": f.samples, "samples_per_hour": f.samples_per_hour,
            "ratio_vs_sync": f.samples_per_hour / base if base else None,
            "reward_per_minute": f.reward_per_minute, "reward_mean": f.reward_mean,
            "stale_waste": f.stale_waste,
        }
        for s, f in zip(args.staleness, figures, strict=True)
    ]  # fmt: skip
    rows = [list(r.values()) for r in records]
    for row, record in zip(rows, records, strict=True):
        ratio = record["ratio_vs_sync"]
        row[5] = "—" if ratio is None else f"{ratio:.2f}×"
    common.print_table(
        f"Async vs sync GRPO, two workers (one throttled) ({common.CONTENDED}; "
        f"{common.load_average()})",
        [
            "max_staleness",
            "versions",
            "window s",
            "samples",
            "samples/h",
            "ratio vs 0",
            "reward/min",
            "mean reward",
            "stale waste",
        ],  # fmt: skip
        rows,
    )
    print(layout.describe())
    print("Published: AReaL 2.77× over synchronous RL; PipelineRL ~2× (large GPU clusters).")
    report.emit(args, {"runs": records, "load": common.load_average()})


if __name__ == "__main__":
    main()
