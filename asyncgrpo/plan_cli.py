"""`asyncgrpo plan`: adapter payload, sync time, learner memory per GPU, and the workers that keep
one learner busy with their cost per 1,000 accepted samples (server/dashboard/fleet_plan.py
states every formula). Pure arithmetic: reads at most a local config.json."""

from __future__ import annotations

import json
from typing import Any

import typer

HELP_GPU = "NAME:USD_PER_HOUR:TOKENS_PER_S, e.g. L4:0.35:1500 (measured or entered)."


def plan(
    model: str = typer.Option(
        "qwen2.5-7b", help="A preset (qwen2.5-7b, qwen2.5-1.5b, llama-2-7b) or a local config.json."
    ),
    rank: int = typer.Option(16, help="LoRA rank."),
    targets: str = typer.Option("all-linear", help="qv, attention or all-linear."),
    link_gbps: float = typer.Option(1.0, help="Link to the workers in Gb/s (sync time)."),
    learner_gpus: int = typer.Option(1, help="GPUs of the (data-parallel) learner."),
    micro_batch_tokens: int = typer.Option(8192, help="Tokens in one micro-batch per GPU."),
    learner_gpu: str = typer.Option(
        None,
        help="The learner's GPU: NAME:USD_PER_HOUR_PER_GPU:TOKENS_PER_S (trained tokens/s of "
        "the whole learner), e.g. H100:2.5:6000.",
    ),
    worker_gpu: list[str] = typer.Option(  # noqa: B008 - typer reads it, never mutates it
        [], help=f"A worker GPU offer (repeat to compare): {HELP_GPU} Tokens/s: generated."
    ),
    prompt_tokens: float = typer.Option(256, help="Mean prompt tokens per sample."),
    completion_tokens: float = typer.Option(512, help="Mean completion tokens per sample."),
    group_size: int = typer.Option(8, help="The run's group_size (G)."),
    bound_groups: int = typer.Option(
        16,
        help="The run's admission bound in groups: (max_staleness + 1) × weight_sync_steps × "
        "prompts_per_step (16 with the defaults).",
    ),
    worker_sequences: int = typer.Option(
        256, help="Sequences one worker keeps in flight (its max_inflight_sequences)."
    ),
    accept_fraction: float = typer.Option(
        1.0, help="Generated samples the learner accepts (not stale or dropped), 0-1."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Plan a run's learner and worker fleet from a model, rank, targets and GPU offers."""
    from server.dashboard.fleet_plan import FleetInputs, Gpu, full_plan
    from server.dashboard.planner import load_shape, plan_shape

    try:
        shape = load_shape(model)
        payload = plan_shape(shape, rank, targets, link_gbps)
        learner = Gpu.parse(learner_gpu) if learner_gpu else None
        workers = [Gpu.parse(w) for w in worker_gpu]
        fleet = FleetInputs(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            group_size=group_size,
            bound_groups=bound_groups,
            worker_sequences=worker_sequences,
            accept_fraction=accept_fraction,
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
        )
    except ValueError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    out = {"payload": payload.__dict__, **result.as_dict()}
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    _print_tables(out)


def _print_tables(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
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
    if not out["fleet"]:
        return
    fleet = Table(title="Workers that keep one learner busy")
    for column in ("GPU", "$/h", "needed", "usable", "workers", "learner busy", "accepted/h"):
        fleet.add_column(column, justify="right")
    fleet.add_column("$ per 1,000 accepted", justify="right")
    for r in out["fleet"]:
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
