"""Multi-turn environments on the worker's engine, and a run on a task that needs a tool.

    nice .venv/bin/python -m bench.environments [--part throughput|learning|both]
        [--prompts 4] [--group-size 4] [--max-new-tokens 48] [--repeats 3]
        [--versions 12] [--workers 2] [--seed 0] [--work-dir DIR] [--json]

Part 1 (`throughput`): trajectories/s and trained (model) tokens/s of `tool_calls`
(calculator, 3 turns) against `single_turn`, in one process on one TransformersBackend with the
small model on CPU, through the worker's own path (worker/rollouts.py `EnvironmentRollouts`: one
thread per trajectory, every turn a `BackendTurnEngine` call), on the same `products` prompts,
sampling and seeds. One warm-up lease per environment, then `--repeats` timed leases; medians.

Part 2 (`learning`): a real run through asyncgrpo/cluster.py (embedded server, `--workers`
rollout workers, the learner) of `--versions` versions on the `products` generator ("What is
48213 * 9177?", reference `answer`) with `environment: tool_calls` + `calculator`, `max_turns` 3,
and `numeric_match`. Per version: the learner's training reward_mean, and from the batches the
workers wrote (copied out of the run's local bucket while it runs and read with
`read_trajectories`) the share of trajectories sampled with that adapter version that call the
calculator correctly (a call whose `expression` evaluates to the prompt's product). The small
model may never call the tool: the curve is reported as it is. Not CI.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402
from protocol import datasets  # noqa: E402
from protocol.environments import EnvironmentConfig  # noqa: E402

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a helpful assistant."
PRODUCT = re.compile(r"What is (\d+) \* (\d+)\?")


def environments(max_total_tokens: int) -> dict[str, dict[str, Any]]:
    return {
        "single_turn": {"name": "single_turn"},
        "tool_calls": {
            "name": "tool_calls",
            "tools": ["calculator"],
            "max_turns": 3,
            "max_total_tokens": max_total_tokens,
        },
    }


# -- part 1: throughput ------------------------------------------------------------------------


def make_lease(env: dict[str, Any], prompts: list[str], args: argparse.Namespace, seed: int) -> Any:
    from protocol.schemas import Lease, LeasePrompt

    return Lease(
        lease_id=uuid.uuid4(), run_id=uuid.UUID(int=1), base_model=MODEL,
        tokenizer_fingerprint=None, sampling={"temperature": 1.0},
        max_new_tokens=args.max_new_tokens, system_prompt=SYSTEM, group_size=args.group_size,
        prompts=[LeasePrompt(prompt_row_id=i, dataset_row_id=i, prompt=p, epoch=0)
                 for i, p in enumerate(prompts)],
        seed=seed, adapter_version=0, fencing=1, ttl_s=600.0, heartbeat_interval_s=60.0,
        batch_key="bench", environment=env,
    )  # fmt: skip


def summarize(samples: Iterable[Any]) -> dict[str, int]:
    totals = {"trajectories": 0, "trained_tokens": 0, "tool_calls": 0, "tool_errors": 0}
    for s in samples:
        t = s.trajectory
        totals["trajectories"] += 1
        totals["trained_tokens"] += sum(t.loss_mask)
        totals["tool_calls"] += t.tool_calls
        totals["tool_errors"] += t.tool_errors
    return totals


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    from protocol.environments import BUILTINS_ONLY
    from worker.backends.transformers import TransformersBackend
    from worker.rollouts import EnvironmentRollouts

    backend = TransformersBackend(MODEL, num_threads=args.threads)
    rollouts = EnvironmentRollouts(backend, allowed=BUILTINS_ONLY)
    prompts = [r["prompt"] for r in datasets.generate("products", args.prompts, args.seed)]
    rows: dict[str, Any] = {}
    try:
        for name, env in environments(args.max_total_tokens).items():
            EnvironmentConfig.model_validate(env)
            rollouts.rollout(make_lease(env, prompts, args, 0), None, threading.Event())  # warm-up
            runs = []
            for r in range(args.repeats):
                lease = make_lease(env, prompts, args, r + 1)
                t0 = time.monotonic()
                samples = rollouts.rollout(lease, None, threading.Event())
                seconds = time.monotonic() - t0
                totals = summarize(samples)
                runs.append({**totals, "seconds": seconds})
                print(f"{name:<12} repeat {r + 1}: {totals} in {seconds:.1f} s", flush=True)
            rows[name] = {
                "trajectories_per_s": statistics.median(
                    x["trajectories"] / x["seconds"] for x in runs
                ),
                "trained_tokens_per_s": statistics.median(
                    x["trained_tokens"] / x["seconds"] for x in runs
                ),
                "trained_tokens_per_trajectory": statistics.median(
                    x["trained_tokens"] / x["trajectories"] for x in runs
                ),
                "tool_calls_per_trajectory": statistics.median(
                    x["tool_calls"] / x["trajectories"] for x in runs
                ),
                "runs": runs,
            }
    finally:
        rollouts.close()
        backend.close()
    return rows


def print_throughput(rows: dict[str, Any], args: argparse.Namespace, out: Any) -> None:
    print(f"\n{args.prompts} products prompts x G={args.group_size}, {args.max_new_tokens} new "
          f"tokens per turn, T=1.0, transformers CPU, median of {args.repeats}",
          file=out)  # fmt: skip
    header = ("environment", "traj/s", "trained tok/s", "tok/traj", "calls/traj")
    print(f"{header[0]:<13}{header[1]:>9}{header[2]:>15}{header[3]:>10}{header[4]:>12}", file=out)
    for name, r in rows.items():
        print(f"{name:<13}{r['trajectories_per_s']:>9.2f}{r['trained_tokens_per_s']:>15.1f}"
              f"{r['trained_tokens_per_trajectory']:>10.1f}{r['tool_calls_per_trajectory']:>12.2f}",
              file=out)  # fmt: skip


# -- part 2: a run on products ------------------------------------------------------------------


def products_config(versions: int, seed: int, max_total_tokens: int) -> dict[str, Any]:
    from asyncgrpo.demo import demo_config

    config = demo_config(versions, seed)
    config["name"] = "bench-environments-products"
    config["dataset"] = {
        "kind": "generator",
        "generator": "products",
        "size": versions * config["prompts_per_step"],
        "seed": seed,
    }
    config["environment"] = environments(max_total_tokens)["tool_calls"]
    config["sampling"] = {"temperature": 1.0, "max_new_tokens": 48}
    config["lease_ttl_s"] = 600.0
    return config


def correct_call(messages: list[Any], product: int) -> bool:
    """Whether a model turn called the calculator with an expression worth `product`."""
    from protocol.calculator import CalculatorError, evaluate

    for m in messages:
        for call in m.tool_calls or []:
            expression = call.arguments.get("expression")
            if call.name != "calculator" or not isinstance(expression, str):
                continue
            try:
                if evaluate(expression) == product:
                    return True
            except (CalculatorError, ValueError, TypeError, ArithmeticError):
                continue
    return False


def read_batch_file(path: Path, environment: EnvironmentConfig, tokenizer: Any) -> Any:
    """The batch as the learner reads it, expectations taken from its own footer."""
    import pyarrow.parquet as pq

    from protocol.batch_format import METADATA_KEY, BatchMetadata
    from protocol.batch_reader import BatchExpectations, read_trajectories

    pf = pq.ParquetFile(path)
    meta = BatchMetadata.model_validate_json((pf.metadata.metadata or {})[METADATA_KEY])
    ids = pf.read(columns=["prompt_row_id"]).column(0).to_pylist()
    expect = BatchExpectations(
        run_id=meta.run_id, lease_id=meta.lease_id, fencing=meta.fencing,
        worker_id=meta.worker_id, adapter_version=meta.adapter_version,
        adapter_sha256=meta.adapter_sha256, tokenizer_fingerprint=meta.tokenizer_fingerprint,
        prompt_row_ids=sorted(set(ids)), group_size=len(ids) // max(1, len(set(ids))),
        vocab_size=len(tokenizer), max_new_tokens=48, kind=meta.kind, environment=environment,
    )  # fmt: skip
    return read_trajectories(path, expect)


def product_asked(messages: list[Any]) -> int | None:
    """The product the prompt (the transcript's last prompt message) asks for."""
    prompts = [m for m in messages if m.kind == "prompt"]
    match = PRODUCT.search(prompts[-1].content) if prompts else None
    return int(match.group(1)) * int(match.group(2)) if match else None


def tool_use_by_version(files: list[Path], config: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Per adapter version sampled with: trajectories, share calling the calculator correctly,
    tool calls and tool errors per trajectory (train batches only)."""
    from lm.models import load_tokenizer

    tokenizer = load_tokenizer(MODEL)
    environment = EnvironmentConfig.model_validate(config["environment"])
    per: dict[int, list[tuple[bool, int, int]]] = {}
    for path in files:
        try:
            batch = read_batch_file(path, environment, tokenizer)
        except Exception as exc:  # noqa: BLE001 - a partial copy or an eval batch: skip it
            print(f"skipped {path.name}: {exc}", flush=True)
            continue
        if batch.metadata.kind != "train":
            continue
        for row in batch.rows:
            messages = row.messages or []
            ok = (product := product_asked(messages)) is not None and correct_call(
                messages, product
            )
            entry = (ok, row.tool_calls, row.tool_errors)
            per.setdefault(batch.metadata.adapter_version, []).append(entry)
    return {
        v: {
            "trajectories": len(xs),
            "correct_call_share": sum(x[0] for x in xs) / len(xs),
            "tool_calls_per_trajectory": sum(x[1] for x in xs) / len(xs),
            "tool_errors_per_trajectory": sum(x[2] for x in xs) / len(xs),
        }
        for v, xs in sorted(per.items())
    }


def copy_batches(bucket: Path, into: Path) -> None:
    """Keep every batch file the workers wrote (the bucket may drop consumed ones)."""
    for path in bucket.rglob("*.parquet"):
        target = into / f"{abs(hash(str(path.relative_to(bucket))))}-{path.name}"
        if not target.exists() and path.stat().st_size > 0:
            try:
                shutil.copyfile(path, target)
            except OSError:
                continue


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def learning(args: argparse.Namespace) -> dict[str, Any]:
    from asyncgrpo.cluster import Cluster, ClusterConfig
    from asyncgrpo.live_run import STOPPED
    from asyncgrpo.live_view import Snapshot, poll

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-environments-"))
    work.mkdir(parents=True, exist_ok=True)
    seen = work / "batches-seen"
    seen.mkdir(exist_ok=True)
    config = products_config(args.versions, args.seed, args.max_total_tokens)
    cluster = Cluster(
        ClusterConfig(
            work_dir=work,
            worker_env={
                "ASYNCGRPO_WORKER_RETRY_MAX_S": "5",
                "ASYNCGRPO_WORKER_ACQUIRE_WAIT_S": "5",
            },
        )
    )
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    snap: Snapshot | None = None
    print(f"work dir {work}", flush=True)
    try:
        cluster.start_server()
        cluster.create_run(config, registration_uses=args.workers)
        cluster.start_learner()
        for i in range(args.workers):
            cluster.start_worker(f"env-worker-{i + 1}")
        version = -1
        while time.monotonic() - started < args.timeout_min * 60:
            time.sleep(5.0)
            copy_batches(Path(cluster.bucket_location), seen)
            try:
                snap = poll(cluster)
            except Exception as exc:  # noqa: BLE001 - a poll during load may time out
                print(f"poll failed: {exc}", flush=True)
                continue
            if int(snap.run["current_version"]) != version:
                version = int(snap.run["current_version"])
                print(f"{time.strftime('%H:%M:%S')} version {version} status {snap.status}",
                      flush=True)  # fmt: skip
            if snap.status in STOPPED:
                break
            if cluster.learner is not None and not cluster.learner.alive():
                print(f"learner exited ({cluster.learner.returncode()})", flush=True)
                break
    except KeyboardInterrupt:
        print("interrupted: reporting what was reached", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        copy_batches(Path(cluster.bucket_location), seen)
        if snap is None:
            try:
                snap = poll(cluster)
            except Exception:  # noqa: BLE001
                pass
        cluster.stop()
    tools = tool_use_by_version(sorted(seen.glob("*.parquet")), config)
    rewards = snap.reward_by_version() if snap is not None else {}
    return {
        "versions": args.versions,
        "status": snap.status if snap is not None else None,
        "reward_by_version": {str(v): r for v, r in rewards.items()},
        "tool_use_by_sampled_version": {str(v): t for v, t in tools.items()},
        "environment": config["environment"],
        "wall_s": time.monotonic() - started,
    }


def print_learning(result: dict[str, Any], out: Any) -> None:
    rewards, tools = result["reward_by_version"], result["tool_use_by_sampled_version"]
    print(f"\nproducts run: {result['versions']} versions, status {result['status']}, "
          f"{result['wall_s'] / 60:.1f} min", file=out)  # fmt: skip
    print("version  reward_mean  trajectories  correct calc share  calls/traj  errors/traj",
          file=out)  # fmt: skip
    for v in sorted({int(k) for k in (*rewards, *tools)}):
        r, t = rewards.get(str(v)), tools.get(str(v), {})
        share = t.get("correct_call_share")
        print(f"{v:7d}  {'-' if r is None else f'{r:.3f}':>11}  {t.get('trajectories', 0):>12}  "
              f"{'-' if share is None else f'{share:.3f}':>18}  "
              f"{t.get('tool_calls_per_trajectory', 0.0):>10.2f}  "
              f"{t.get('tool_errors_per_trajectory', 0.0):>11.2f}", file=out)  # fmt: skip
    print(
        "(reward: the learner's training reward_mean of the step that made the version; "
        "tool use: trajectories sampled with that version)",
        file=out,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["throughput", "learning", "both"], default="both")
    parser.add_argument("--prompts", type=int, default=4, help="part 1: prompts per lease")
    parser.add_argument("--group-size", type=int, default=4, help="part 1: trajectories/prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="part 1: per model turn")
    parser.add_argument("--max-total-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="part 1: timed leases")
    parser.add_argument("--threads", type=int, default=None, help="part 1: torch threads")
    parser.add_argument("--versions", type=int, default=12, help="part 2: adapter versions")
    parser.add_argument("--workers", type=int, default=2, help="part 2: rollout workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-min", type=float, default=90.0, help="part 2")
    parser.add_argument("--work-dir", type=Path, default=None, help="part 2")
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    if args.max_new_tokens >= args.max_total_tokens:
        parser.error("--max-new-tokens must be below --max-total-tokens")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures: dict[str, Any] = {"part": args.part}
    if args.part in ("throughput", "both"):
        figures["throughput"] = throughput(args)
        print_throughput(figures["throughput"], args, sys.stdout)
        single = figures["throughput"]["single_turn"]["trajectories_per_s"]
        figures["tool_calls_vs_single_turn_trajectories"] = (
            figures["throughput"]["tool_calls"]["trajectories_per_s"] / single
        )
    if args.part in ("learning", "both"):
        figures["learning"] = learning(args)
        print_learning(figures["learning"], sys.stdout)
    report.emit(args, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
