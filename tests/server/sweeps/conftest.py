"""The runs tests' app on Postgres and SQLite (tests/server/runs/conftest.py), for sweeps."""

from __future__ import annotations

from typing import Any

from tests.server.runs.conftest import admin, db, example_config, runs_app, runs_client

__all__ = ["admin", "db", "runs_app", "runs_client", "sweep_body"]


def sweep_body(name: str = "lr-rank", **fields: Any) -> dict[str, Any]:
    """A 2 × 2 grid (learning rate × LoRA rank) on the example config."""
    body: dict[str, Any] = {
        "name": name,
        "base": example_config(),
        "grid": {"grpo.learning_rate": [1e-5, 3e-5], "lora.rank": [8, 32]},
    }
    body.update(fields)
    return body
