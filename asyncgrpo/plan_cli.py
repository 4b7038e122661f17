"""`asyncgrpo plan`: adapter payload, sync time, learner memory per GPU, and the workers that keep
one learner busy with their cost per 1,000 accepted samples, and a sweep's cost with one learner
per run and on pool learners (server/dashboard/fleet_plan.py states every formula). Pure
arithmetic: reads at most a local config.json."""

from __future__ import annotations

import json
from typing import Any, NoReturn

import typer

from protocol.gpu_prices import LEARNER_EXAMPLE, WORKER_EXAMPLES

EXAMPLES = "example figures, not measurements: docs/reference/gpu-prices.md gives their sources"
HELP_GPU = f"NAME:USD_PER_HOUR:TOKENS_PER_S, e.g. {WORKER_EXAMPLES[0]} ({EXAMPLES})."


def plan(
    model: str = typer.Option(
        "qwen2.5-7b",
        help="A preset (qwen2.5-7b, qwen2.5-1.5b, llama-2-7b, smollm2-135m) or a local "
        "config.json.",
    ),
    rank: int = typer.Option(16, help="LoRA rank."),
    targets: str = typer.Option("all-linear", help="qv, attention or all-linear."),
    link_gbps: float = typer.Option(1.0, help="Link to the workers in Gb/s (sync time)."),
    learner_gpus: int = typer.Option(
        1,
        help="GPUs of the learner (torchrun --nproc-per-node N; the fsdp layouts shard the "
        "decoder layers' base weights over them).",
    ),
    micro_batch_tokens: int = typer.Option(8192, help="Tokens in one micro-batch per GPU."),
    learner_gpu: str = typer.Option(
        None,
        help="The learner's GPU: NAME:USD_PER_HOUR_PER_GPU:TOKENS_PER_S (completion tokens "
        f"trained per second by the whole learner), e.g. {LEARNER_EXAMPLE} ({EXAMPLES}); "
        "NAME:PRICE takes the tokens/s measured by --from-run.",
        show_default="none",
    ),
    worker_gpu: list[str] = typer.Option(  # noqa: B008 - typer reads it, never mutates it
        [],
        help=f"A worker GPU offer (repeat to compare): {HELP_GPU} Tokens/s: generated; "
        "NAME:PRICE takes the tokens/s measured for that GPU type by --from-run.",
        show_default="none",
    ),
    completion_tokens: float = typer.Option(
        None, help="Mean completion tokens per sample.", show_default="512, or measured"
    ),
    group_size: int = typer.Option(
        None, help="The run's group_size.", show_default="8, or the run's"
    ),
    bound_groups: int = typer.Option(
        None,
        help="The run's admission bound in groups: (max_staleness + 1) × weight_sync_steps × "
        "prompts_per_step.",
        show_default="16, the defaults' bound, or the run's",
    ),
    worker_sequences: int = typer.Option(
        256, help="Sequences one worker keeps in flight (its max_inflight_sequences)."
    ),
    accept_fraction: float = typer.Option(
        None,
        help="Generated samples the learner accepts (not stale or dropped), 0-1.",
        show_default="1, or measured",
    ),
    runs: int = typer.Option(
        1,
        help="Runs of a sweep (asyncgrpo sweep): what they cost with one learner each and "
        "with pool learners, how many one learner GPU could hold by memory and keep up with "
        "by tokens/s, and the --max-runs suggested to a pool learner.",
    ),
    gradient_checkpointing: bool = typer.Option(
        False,
        "--gradient-checkpointing",
        help="The sweep's runs use gradient checkpointing (grpo.gradient_checkpointing): "
        "pool learners hold them in the single+ckpt layout.",
        show_default="off",
    ),
    samples_per_run: float = typer.Option(
        None,
        help="Accepted samples each run of the sweep trains on (e.g. dataset rows × epochs × "
        "group_size): the sweep's hours and total cost.",
        show_default="none",
    ),
    from_run: str = typer.Option(
        None,
        help="A run id: take tokens/s, completion length, accepted fraction, group size and "
        "bound from what it measured (last 10 min; reads the server's database, "
        "ASYNCGRPO_DATABASE_URL). Options given explicitly win.",
        show_default="none",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON instead of tables.", show_default="tables"
    ),
) -> None:
    """Plan a run's learner and worker fleet from a model, rank, targets and GPU offers.

    Prints the adapter payload and sync time; the learner's memory per GPU in four layouts
    (single, single+ckpt, fsdp, fsdp+ckpt: bf16 base weights as with the learner's --dtype
    bfloat16, FSDP sharding the decoder layers' base weights only, as the learner's --fsdp
    does); and, given --learner-gpu and --worker-gpu offers, the workers of each offer that
    keep one learner busy (capped by the admission bound) with the cost per 1,000 accepted
    samples. With --runs: what a sweep of that many runs costs with one learner per run, how
    many runs one learner GPU could hold by memory and keep up with by tokens/s, the runs per
    pool learner GPU (the --max-runs to give `asyncgrpo learner`) and the sweep's cost on
    pool learners. Bad input exits 2 with the option and the reason.
    """
    from server.dashboard.fleet_plan import FleetInputs, Gpu, full_plan
    from server.dashboard.planner import load_shape, plan_shape

    measured = _measured(from_run) if from_run else None
    m = measured.__dict__ if measured else {}

    def pick(given: Any, key: str, default: Any) -> Any:
        return given if given is not None else (m.get(key) or default)

    try:
        shape = load_shape(model)
        payload = plan_shape(shape, rank, targets, link_gbps)
        learner_rate = (
            {learner_gpu.split(":")[0]: m["learner_tokens_per_s"]}
            if (learner_gpu and m.get("learner_tokens_per_s"))
            else None
        )
        learner = Gpu.parse(learner_gpu, learner_rate) if learner_gpu else None
        workers = [Gpu.parse(w, m.get("worker_tokens_per_s")) for w in worker_gpu]
        fleet = FleetInputs(
            completion_tokens=pick(completion_tokens, "completion_tokens", 512.0),
            group_size=pick(group_size, "group_size", 8),
            bound_groups=pick(bound_groups, "bound_groups", 16),
            worker_sequences=worker_sequences,
            accept_fraction=pick(accept_fraction, "accept_fraction", 1.0),
            learner_gpus=learner_gpus,
        )
        result = full_plan(
            shape,
            rank,
            targets,
            micro_batch_tokens=micro_batch_tokens,
            learner=learner,
            workers=workers,
            fleet=fleet,
            runs=runs,
            samples_per_run=samples_per_run,
            checkpointing=gradient_checkpointing,
        )
    except ValueError as exc:
        _fail(_as_option(str(exc)))
    out = {"payload": payload.__dict__, **result.as_dict(), "measured": m or None}
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    _print_tables(out)


def _as_option(message: str) -> str:
    """`group_size must be …` → `--group-size must be …`: the option the user typed."""
    from server.dashboard.fleet_plan import LIMITS

    field = message.split(" ", 1)[0]
    return f"--{field.replace('_', '-')}{message[len(field) :]}" if field in LIMITS else message


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _measured(run_id: str) -> Any:
    """The run's measurements from the server's database (server/dashboard/measured.py)."""
    import uuid

    from sqlalchemy.exc import SQLAlchemyError

    from asyncgrpo.cli import _settings
    from server.dashboard.measured import measure
    from server.db import make_engine, make_sessionmaker, transaction

    try:
        rid = uuid.UUID(run_id)
    except ValueError:
        _fail(f"--from-run: {run_id!r} is not a run id (a UUID)")
    url = _settings().database_url
    _refuse_missing_sqlite(url)
    try:
        engine = make_engine(url)
    except (SQLAlchemyError, ValueError, ImportError) as exc:  # ImportError: no such driver
        _fail(f"--from-run: ASYNCGRPO_DATABASE_URL is not a database URL ({_first_line(exc)})")
    try:
        with transaction(make_sessionmaker(engine)) as session:
            return measure(session, rid)
    except LookupError as exc:
        _fail(f"--from-run: {exc}")
    except SQLAlchemyError as exc:
        _fail(
            "--from-run: cannot read the server's database (is ASYNCGRPO_DATABASE_URL the "
            f"server's, migrated with `asyncgrpo db upgrade`?): {_first_line(exc)}"
        )
    finally:
        engine.dispose()


def _first_line(exc: Exception) -> str:
    """The driver's own message (no SQL, no parameters)."""
    orig = getattr(exc, "orig", None)
    return str(orig if orig is not None else exc).strip().splitlines()[0]


def _refuse_missing_sqlite(url: str) -> None:
    """A SQLite URL whose file does not exist: an error, not a new empty database file."""
    from pathlib import Path

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # make_engine names it
    path = parsed.database
    if parsed.get_backend_name() == "sqlite" and path and path != ":memory:":
        if not Path(path).is_file():
            _fail(f"--from-run: no database at {path} (set ASYNCGRPO_DATABASE_URL to the server's)")


def _print_tables(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if out["measured"]:
        m = out["measured"]
        console.print(
            f"measured by run {m['run_name']!r} (last 10 min): learner "
            f"{m['learner_tokens_per_s'] or 0:.0f} tokens/s, workers {m['worker_tokens_per_s']} "
            f"tokens/s, {m['completion_tokens'] or 0:.0f} completion tokens per sample, "
            f"accepted {m['accept_fraction'] or 0:.0%}; G {m['group_size']}, "
            f"bound {m['bound_groups']} groups"
        )
    p = out["payload"]
    console.print(
        f"[bold]{p['model']}[/], rank {p['rank']}, {p['targets']}: adapter "
        f"{p['adapter_mb']:.1f} MB ({p['lora_params']:,} params, bf16), "
        f"{p['sync_seconds']:.2f} s per sync at {p['link_gbps']} Gb/s "
        f"(full weights {p['full_weights_gb']:.1f} GB, {p['full_sync_seconds']:.0f} s)"
    )
    gpu_gb = out["learner_gpu_memory_gb"]
    memory = Table(
        title=f"Learner memory per GPU, GB ({out['learner_gpus']} GPU(s), "
        f"{out['micro_batch_tokens']:,} tokens per micro-batch)"
    )
    for column in ("layout", "weights", "LoRA state", "activations", "logits", "total", "fits"):
        memory.add_column(column, justify="left" if column == "layout" else "right")
    for layout, m in out["memory"].items():
        fits = "" if gpu_gb is None else ("yes" if m["total"] <= gpu_gb else "no")
        cells = [m[k] for k in ("weights", "lora_state", "activations", "logits", "total")]
        memory.add_row(layout, *(f"{c:.2f}" for c in cells), fits)
    console.print(memory)
    if out["fleet"]:
        _print_fleet(console, out["fleet"])
    sweep = out["sweep"]
    if sweep["runs"] > 1 or sweep["samples_per_run"]:
        _print_sweep(console, sweep)


def _print_fleet(console: Any, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    fleet = Table(title="Workers that keep one learner busy")
    for column in ("GPU", "$/h", "needed", "usable", "workers", "learner busy", "accepted/h"):
        fleet.add_column(column, justify="right")
    fleet.add_column("$ per 1,000 accepted", justify="right")
    for r in rows:
        workers = f"{r['workers']}{' (bound)' if r['bound_limited'] else ''}"
        fleet.add_row(
            r["gpu"],
            f"{r['price_per_hour']:.2f}",
            str(r["workers_needed"]),
            str(r["workers_usable"]),
            workers,
            f"{r['learner_busy']:.0%}",
            f"{r['accepted_per_hour']:,.0f}",
            f"{r['cost_per_1000_accepted']:.3f}",
        )
    console.print(fleet)


def _print_sweep(console: Any, sweep: dict[str, Any]) -> None:
    from rich.table import Table

    held = sweep["runs_by_memory"]
    console.print(
        f"a sweep of {sweep['runs']} run(s): each run a learner holds adds "
        f"{sweep['lora_state_gb']:.3f} GB of LoRA state; runs of this model one learner GPU "
        "could hold by memory: "
        + (
            ", ".join(f"{layout} {n:,}" for layout, n in held.items())
            if held
            else "unknown (no memory figure for the learner's GPU type)"
        )
    )
    if not sweep["rows"]:
        return
    samples = sweep["samples_per_run"]
    table = Table(
        title=f"A sweep of {sweep['runs']} run(s), one learner each"
        + (f", {samples:,.0f} accepted samples per run" if samples else "")
    )
    for column in ("GPU", "learner GPUs", "workers", "$/h", "accepted/h", "hours", "$ total"):
        table.add_column(column, justify="right")
    table.add_column("runs a learner keeps up with", justify="right")
    for r in sweep["rows"]:
        table.add_row(
            r["gpu"],
            str(r["learner_gpus"]),
            str(r["workers"]),
            f"{r['cost_per_hour']:.2f}",
            f"{r['accepted_per_hour']:,.0f}",
            "—" if r["hours"] is None else f"{r['hours']:.2f}",
            "—" if r["cost"] is None else f"{r['cost']:.2f}",
            f"{r['runs_by_tokens']:.2f}",
        )
    console.print(table)
    console.print(
        "keeps up with: the learner's tokens/s ÷ the most one run's workers deliver under its "
        "admission bound (below 1: one run alone can feed it more than it trains)"
    )
    _print_pool(console, sweep)


def _print_pool(console: Any, sweep: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"The same sweep on pool learners ({sweep['pool_layout']} layout)")
    for column in ("GPU", "--max-runs", "learner GPUs", "workers", "$/h", "$ total"):
        table.add_column(column, justify="right")
    for r in sweep["rows"]:
        table.add_row(
            r["gpu"],
            _or_dash(r["runs_per_learner"], "{}"),
            _or_dash(r["pool_learner_gpus"], "{}"),
            str(r["workers"]),
            _or_dash(r["pool_cost_per_hour"], "{:.2f}"),
            _or_dash(r["pool_cost"], "{:.2f}"),
        )
    console.print(table)
    console.print(
        "--max-runs: the runs one pool learner GPU holds by memory, no more than it keeps up "
        "with (at least 1), the sweep's runs and 64 (—: unknown without the GPU's memory or "
        "with more than one learner GPU; 0: not even one run fits); the workers unchanged"
    )


def _or_dash(value: Any, spec: str) -> str:
    return "—" if value is None else spec.format(value)
