"""Run creation refuses over-long or newline-ended reward and environment names and ill-typed
built-in reward kwargs with a 422 naming the field (and the kwarg), on Postgres and SQLite;
nothing is created."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import Run
from tests.server.runs.conftest import example_config

LONG_NAME = "x" * 10_002
JUDGE = {"model": "m", "base_url": "https://judge.example.com/v1"}


@pytest.mark.parametrize(
    ("overrides", "field", "code"),
    [
        ({"rewards": [{"name": LONG_NAME}]}, "rewards.0.name", "name_too_long"),
        ({"rewards": [{"name": "pkg.mod:" + "f" * 193}]}, "rewards.0.name", "name_too_long"),
        ({"environment": {"name": "e" * 10_240}}, "environment.name", "name_too_long"),
        ({"rewards": [{"name": "mymod:score\n"}]}, "rewards.0.name", "config_rule"),
        ({"environment": {"name": "mymod:Env\n"}}, "environment.name", "config_rule"),
        (
            {"rewards": [{"name": "length_limit", "kwargs": {"max_chars": "x"}}]},
            "rewards.0.kwargs.max_chars",
            "reward_kwarg_invalid",
        ),
        (
            {"rewards": [{"name": "length_limit", "kwargs": {"max_chars": [1]}}]},
            "rewards.0.kwargs.max_chars",
            "reward_kwarg_invalid",
        ),
        (
            {"rewards": [{"name": "hash_score", "kwargs": {"salt": 7}}]},
            "rewards.0.kwargs.salt",
            "reward_kwarg_invalid",
        ),
        (  # a built-in with its own range checks: the declared types come first
            {"rewards": [{"name": "llm_judge", "kwargs": {**JUDGE, "max_score": "10"}}]},
            "rewards.0.kwargs.max_score",
            "reward_kwarg_invalid",
        ),
        (
            {"rewards": [{"name": "think_format", "kwargs": {"think_in_prompt": "yes"}}]},
            "rewards.0.kwargs.think_in_prompt",
            "reward_kwarg_invalid",
        ),
        (
            {"rewards": [{"name": "math_verify", "kwargs": {"column": 1}}]},
            "rewards.0.kwargs.column",
            "reward_kwarg_invalid",
        ),
    ],
)
def test_bad_names_and_kwargs_are_422_naming_the_field(  # type: ignore[no-untyped-def]
    runs_client, admin, db: Session, overrides: dict[str, Any], field: str, code: str
) -> None:
    resp = runs_client.post("/api/v1/runs", json=example_config(**overrides), headers=admin)
    assert resp.status_code == 422, resp.text
    errors = resp.json()["errors"]
    assert [(e["field"], e["type"]) for e in errors] == [(field, code)], resp.text
    assert LONG_NAME not in resp.text
    assert db.execute(select(Run)).first() is None


def test_names_of_200_characters_and_typed_kwargs_are_created(  # type: ignore[no-untyped-def]
    runs_client, admin
) -> None:
    rewards = [
        {"name": "length_limit", "kwargs": {"max_chars": 64}},
        {"name": "a" * 200, "weight": 0.5},
    ]
    config = example_config(rewards=rewards, environment={"name": "pkg.env:" + "E" * 192})
    resp = runs_client.post("/api/v1/runs", json=config, headers=admin)
    assert resp.status_code == 201, resp.text
    stored = resp.json()["run"]["config"]
    assert stored["rewards"][0]["kwargs"] == {"max_chars": 64}
    assert len(stored["rewards"][1]["name"]) == len(stored["environment"]["name"]) == 200
