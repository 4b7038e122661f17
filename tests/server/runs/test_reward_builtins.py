"""Run creation with the built-ins math_verify, think_format and llm_judge: their kwargs are
validated with the reason, the judge's key is never taken, and a judge URL whose host is an IP
literal the outbound policy refuses (judge_url_refused) or that the client cannot use
(judge_url_invalid) is 422 (nothing created)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import Run
from tests.server.runs.conftest import example_config

JUDGE = {"name": "llm_judge", "kwargs": {"base_url": "https://judge.example.com/v1", "model": "m"}}


def _judge(**kwargs: Any) -> dict[str, Any]:
    return {"name": "llm_judge", "kwargs": {**JUDGE["kwargs"], **kwargs}}  # type: ignore[dict-item]


def test_runs_with_the_new_builtins_are_created(runs_client, admin) -> None:  # type: ignore[no-untyped-def]
    rewards = [
        {"name": "math_verify", "kwargs": {"column": "answer"}},
        {"name": "think_format", "weight": 0.2},
        _judge(api_key_env="JUDGE_API_KEY", max_concurrency=4),
    ]
    resp = runs_client.post("/api/v1/runs", json=example_config(rewards=rewards), headers=admin)
    assert resp.status_code == 201, resp.text
    stored = resp.json()["run"]["config"]["rewards"]
    assert [r["name"] for r in stored] == ["math_verify", "think_format", "llm_judge"]
    assert stored[2]["kwargs"]["api_key_env"] == "JUDGE_API_KEY"


@pytest.mark.parametrize(
    ("reward", "field", "message", "code"),
    [
        (
            {"name": "math_verify", "kwargs": {"columns": "answer"}},
            "rewards.0.kwargs",
            "math_verify takes no argument columns (it takes: column)",
            "validation_failed",
        ),
        (
            _judge(api_key="sk-live-123"),
            "rewards.0.kwargs",
            "the API key never goes in the run",
            "validation_failed",
        ),
        (
            _judge(base_url="judge:8000"),
            "rewards.0.kwargs",
            "base_url must be an http(s) URL",
            "validation_failed",
        ),
        (
            _judge(base_url="http://127.0.0.1:8000/v1"),
            "rewards.0.kwargs.base_url",
            "the judge's host is refused: 127.0.0.1 is a loopback",
            "judge_url_refused",
        ),
        (
            _judge(base_url="http://169.254.169.254/v1"),
            "rewards.0.kwargs.base_url",
            "ASYNCGRPO_OUTBOUND_ALLOW_PRIVATE",
            "judge_url_refused",
        ),
        (  # httpx cannot parse it: the learner's calls would raise httpx.InvalidURL
            _judge(base_url="http://0177.0.0.1:8000/v1"),
            "rewards.0.kwargs.base_url",
            "host '0177.0.0.1' is not a canonical IPv4 address",
            "judge_url_invalid",
        ),
        (  # resolvers read it as 127.0.0.1
            _judge(base_url="http://127.1:8000/v1"),
            "rewards.0.kwargs.base_url",
            "host '127.1' is not a canonical IPv4 address",
            "judge_url_invalid",
        ),
    ],
)
def test_bad_reward_kwargs_are_422_with_the_reason(  # type: ignore[no-untyped-def]
    runs_client, admin, db: Session, reward, field, message, code
) -> None:
    resp = runs_client.post("/api/v1/runs", json=example_config(rewards=[reward]), headers=admin)
    assert resp.status_code == 422, resp.text
    body = resp.json()
    found = body.get("errors") or [{"field": body.get("field"), "message": body["detail"]}]
    assert [e["field"] for e in found] == [field]
    assert message in found[0]["message"]
    assert body["code"] == code
    assert "sk-live-123" not in resp.text
    assert db.execute(select(Run)).first() is None
