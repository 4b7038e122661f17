"""THE run-config builder of the tests and benchmarks: `run_config` with the tiny defaults of a
test run, layers of overrides a family of tests shares (`LIVE_RUN`: the real small model
generates and trains), the datasets they are made of, and `create_run` through the API."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from protocol.client import AsyncGrpoClient

SMALL_MODEL = "smollm2-135m-instruct"

# The rest is RunConfig's own defaults (protocol/run_config.py).
DEFAULTS: dict[str, Any] = {
    "name": "test-run",
    "base_model": SMALL_MODEL,
    "dataset": {
        "kind": "jsonl",
        "rows": [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)],
    },
    "rewards": [{"name": "numeric_match"}],
    "group_size": 2,
    "prompts_per_lease": 2,
    "prompts_per_step": 2,
}

# A run the real small model generates and the real learner trains, kept small: LoRA r 4 on
# q/v, 16 new tokens, G = 4, four groups a step, a heartbeat a second.
LIVE_RUN: dict[str, Any] = {
    "lora": {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
    "sampling": {"temperature": 1.0, "max_new_tokens": 16},
    "group_size": 4,
    "prompts_per_step": 4,
    "heartbeat_interval_s": 1.0,
}


def run_config(*layers: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """`DEFAULTS`, then each layer, then `overrides`, each replacing whole top-level fields
    (an override of `grpo` replaces all of it). A plain dict: post it or validate it."""
    config = dict(DEFAULTS)
    for layer in (*layers, overrides):
        config.update(layer)
    return config


def jsonl(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """An inline dataset of these rows."""
    return {"kind": "jsonl", "rows": rows}


def plus_rows(n: int, plus: int = 1) -> list[dict[str, Any]]:
    """`What is i + plus?` for i < n, with its answer."""
    return [{"prompt": f"What is {i} + {plus}?", "answer": str(i + plus)} for i in range(n)]


def arithmetic(size: int, seed: int = 0) -> dict[str, Any]:
    """The built-in arithmetic generator's dataset (protocol/datasets.py)."""
    return {"kind": "generator", "generator": "arithmetic", "size": size, "seed": seed}


@dataclass(frozen=True)
class CreatedRun:
    run_id: str
    learner_token: str
    registration_token: str | None  # for the run's workers, when one was asked for


def create_run(
    admin: AsyncGrpoClient, config: Mapping[str, Any], registration_uses: int | None = None
) -> CreatedRun:
    """Create the run through the API (an admin's client); with `registration_uses`, also a
    registration token of that many uses (24 h) for its workers."""
    created = admin.create_run(dict(config))
    registration = None
    if registration_uses is not None:
        token = admin.create_registration_token(max_uses=registration_uses)
        registration = str(token["token"])
    return CreatedRun(str(created["run"]["id"]), str(created["learner_token"]), registration)
