"""Attach checks the run's rewards against what the learner's host allows (it reports the names
at attach): a run naming a reward the learner cannot load is failed at once with the reason,
and attach answers 409 naming it. The learner side goes through the real client."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from protocol.client import AsyncGrpoClient, ConflictError
from protocol.rewards import RewardAllowlist
from protocol.schemas_learner import MISSING_REWARDS
from server.db import transaction
from server.models import Event
from tests.server.learner.support import FP, RunHandle, make_run, run_row

USER_REWARDS = [
    {"name": "numeric_match"},
    {"name": "my_rewards.math:exact", "weight": 0.5},
    {"name": "my_entry_point"},
]


def _client(client, run: RunHandle) -> AsyncGrpoClient:  # type: ignore[no-untyped-def]
    return AsyncGrpoClient("http://testserver", run.token, http=client, max_retries=0)


def _events(app, run: RunHandle) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def, type-arg]
    """The run's alarm and failure events (not the info ones: attaches, publishes)."""
    with transaction(app.state.sessionmaker) as session:
        rows = session.execute(
            select(Event.kind, Event.data).where(Event.run_id == run.id, Event.severity != "info")
        )
        return [(kind, data) for kind, data in rows]


def test_a_reward_the_learner_cannot_load_fails_the_run_at_attach(app, client) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app, rewards=USER_REWARDS)
    learner = _client(client, run)
    only_the_module = RewardAllowlist(modules=frozenset({"my_rewards.math"}))
    with pytest.raises(ConflictError) as refused:
        learner.learner_attach(str(run.id), FP, reward_names=only_the_module.names())
    detail = str(refused.value.detail)
    assert MISSING_REWARDS in detail and "my_entry_point" in detail
    assert "my_rewards.math:exact" not in detail and "numeric_match" not in detail
    row = run_row(app, run.id)
    assert row.status == "failed" and row.status_reason is not None
    assert "my_entry_point" in row.status_reason and "--reward-module" in row.status_reason
    assert row.learner_attached_at is None
    assert _events(app, run) == [
        (
            "run.failed",
            {"reason": row.status_reason, "missing_rewards": ["my_entry_point"]},
        )
    ]
    # the learner stops: a later attach meets the failed run
    with pytest.raises(ConflictError, match="run is failed"):
        learner.learner_attach(str(run.id), FP, reward_names=only_the_module.names())


def test_a_learner_that_can_load_every_reward_attaches(app, client) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app, rewards=USER_REWARDS)
    allowed = RewardAllowlist(
        modules=frozenset({"my_rewards.math"}),
        entry_points={"my_entry_point": "my_rewards.other:score"},
    )
    attached = _client(client, run).learner_attach(str(run.id), FP, reward_names=allowed.names())
    assert attached.fencing > 0
    assert run_row(app, run.id).status == "running"


def test_a_module_allowed_by_name_covers_only_that_module(app, client) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app, rewards=[{"name": "my_rewards.math.deep:exact"}])
    parent_only = RewardAllowlist(modules=frozenset({"my_rewards.math"}))
    with pytest.raises(ConflictError, match="my_rewards.math.deep:exact"):
        _client(client, run).learner_attach(str(run.id), FP, reward_names=parent_only.names())
    assert run_row(app, run.id).status == "failed"


def test_a_misconfigured_standby_does_not_fail_a_run_another_learner_holds(app, client) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app, rewards=USER_REWARDS)
    learner = _client(client, run)
    learner.learner_attach(str(run.id), FP)  # an older learner: reports nothing, not checked
    with pytest.raises(ConflictError, match="my_entry_point"):
        learner.learner_attach(str(run.id), FP, reward_names=RewardAllowlist().names())
    row = run_row(app, run.id)
    assert row.status == "running" and row.status_reason == "learner attached"
    assert _events(app, run) == []


def test_reported_reward_names_are_bounded(app, client) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app)
    body = {"tokenizer_fingerprint": FP, "reward_names": [f"m{i}:*" for i in range(1001)]}
    response = client.post(run.url("learner/attach"), json=body, headers=run.headers)
    assert response.status_code == 422
    body = {"tokenizer_fingerprint": FP, "reward_names": ["x" * 301]}
    response = client.post(run.url("learner/attach"), json=body, headers=run.headers)
    assert response.status_code == 422
    assert run_row(app, run.id).status == "pending"
