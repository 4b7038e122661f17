"""Admission control on and off: stale waste and wasted worker-seconds at max_staleness 1, 2, 4.

The same cluster as bench/async_vs_sync.py (Postgres, moto S3 in its own process, a learner, a
fast and a throttled worker; see there for the CPU layout). Each setting trains the tiny run to
a fixed number of versions with `admission_control` on (acquire answers 204 at the bound
(max_staleness + 1) × weight_sync_steps × prompts_per_step groups; a heartbeat aborts a lease
whose version can no longer be admissible) and off (no bound, no abort: the learner's claim
still rejects batches older than max_staleness — invariant 5 holds either way).

Stale waste and wasted worker-seconds are the server's own figure over the whole run
(server/runs/waste.py: samples rejected stale at claim + samples of leases aborted as stale, over
samples generated; in worker-seconds, the generation time of the stale-rejected batches + the
lifetime of the stale-aborted leases). CPU-contended figures (2 shared cores).

The learner is throttled (--learner-duty, default 10% of wall time) so that the two workers
outpace it: with an unthrottled learner on this machine the workers are the bottleneck, nothing
ever waits long enough to go stale, and both settings show zero waste.

    .venv/bin/python bench/admission.py [--versions 20] [--staleness 1 2 4] \
        [--learner-duty 0.1] [--json]
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
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--slow-duty", type=float, default=1 / 3)
    parser.add_argument(
        "--learner-duty",
        type=float,
        default=0.1,
        help="Throttle the learner to this share of wall time, so that the workers outpace it "
        "(the case admission control is for); 1 leaves it unthrottled.",
    )
    report.add_json_flag(parser)
    args = parser.parse_args()
    layout = common.Layout(
        slow_duty=args.slow_duty,
        learner_duty=args.learner_duty if args.learner_duty < 1 else None,
    )
    settings = [(s, on) for s in args.staleness for on in (True, False)]
    configs = [
        run_config(
            common.SWEEP_RUN,
            name=f"bench-admission-s{s}-{'on' if on else 'off'}",
            max_versions=args.versions,
            max_staleness=s,
            admission_control=on,
        )
        for s, on in settings
    ]
    figures = common.sweep(configs, layout)
    records = [
        {
            "max_staleness": s, "admission_control": on, "versions": f.versions,
            "generated": f.generated, "stale_rejected": f.stale_rejected,
            "aborted_stale": f.aborted, "stale_waste": f.stale_waste,
            "wasted_worker_s": f.wasted_worker_s, "worker_s": f.worker_s,
            "samples_per_hour": f.samples_per_hour,
        }
        for (s, on), f in zip(settings, figures, strict=True)
    ]  # fmt: skip
    rows = [[*r.values()] for r in records]
    for row in rows:
        row[1] = "on" if row[1] else "off"
    common.print_table(
        f"Admission control ({common.CONTENDED}; {common.load_average()})",
        [
            "max_staleness",
            "admission",
            "versions",
            "generated",
            "stale rejected",
            "aborted",
            "stale waste",
            "wasted worker-s",
            "worker-s",
            "samples/h",
        ],  # fmt: skip
        rows,
    )
    print(layout.describe())
    report.emit(args, {"runs": records, "load": common.load_average()})


if __name__ == "__main__":
    main()
