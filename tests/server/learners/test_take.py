"""The take: runs that need a learner, of the pool learner's model and tokenizer, never more
than max_runs held (held runs counted); a lapsed lease makes a run takeable again; a run with a
live per-run learner lease is never taken. Each run by one compare-and-set (the race:
test_take_race.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from server.db import transaction
from server.models import Run
from tests.server.learner.support import make_run, run_row
from tests.server.learners.conftest import attach, lapse, register, take, taken_ids

pytestmark = pytest.mark.timeout(120)


def test_take_matches_model_and_fingerprint(runs_app, runs_client) -> None:
    fits = make_run(runs_app)
    other_model = make_run(runs_app, base_model="qwen2.5-0.5b-instruct")
    other_fp = make_run(runs_app)
    with transaction(runs_app.state.sessionmaker) as session:
        session.execute(
            update(Run).where(Run.id == other_fp.id).values(tokenizer_fingerprint="other-fp")
        )
    _, pool = register(runs_client, runs_app)
    answer = take(runs_client, pool, 4)
    assert taken_ids(answer) == [fits.id]
    assert answer["runs"][0]["attach_path"] == f"/api/v1/runs/{fits.id}/learner/attach"
    assert answer["held"] == [str(fits.id)] and answer["hold_s"] > 0
    assert run_row(runs_app, other_model.id).pool_learner_id is None
    assert run_row(runs_app, other_fp.id).pool_learner_id is None


def test_max_runs_bounds_the_runs_held(runs_app, runs_client) -> None:
    runs = [make_run(runs_app) for _ in range(3)]
    learner_id, pool = register(runs_client, runs_app, max_runs=2)
    first = take(runs_client, pool, 1)
    assert len(taken_ids(first)) == 1
    second = take(runs_client, pool, 2)  # one held: room for one more
    assert len(taken_ids(second)) == 1
    assert second["held"] == [str(taken_ids(first)[0]), str(taken_ids(second)[0])]
    runs.sort(key=lambda r: (r.id not in taken_ids(first), r.id not in taken_ids(second)))
    full = take(runs_client, pool, 2)
    assert full["runs"] == [] and len(full["held"]) == 2
    over = runs_client.post("/api/v1/learners/take", json={"max": 3}, headers=pool)
    assert over.status_code == 422
    assert over.json()["code"] == "invalid_value"
    assert [e["field"] for e in over.json()["errors"]] == ["max"]
    for bad in (0, 65, "x"):
        refused = runs_client.post("/api/v1/learners/take", json={"max": bad}, headers=pool)
        assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "max"
    # An attached run stays held by its learner lease; a lapsed one frees a slot.
    assert attach(runs_client, pool, runs[0].id).status_code == 200
    lapse(runs_app, runs[1].id)
    again = take(runs_client, pool, 2)  # one slot: runs[1] (lapsed) or runs[2], not both
    assert len(taken_ids(again)) == 1 and taken_ids(again)[0] in {runs[1].id, runs[2].id}
    assert len(again["held"]) == 2 and str(runs[0].id) in again["held"]
    assert run_row(runs_app, runs[0].id).pool_learner_id == learner_id


def test_a_lapsed_lease_makes_the_run_takeable_by_another(runs_app, runs_client) -> None:
    run = make_run(runs_app)
    first_id, first = register(runs_client, runs_app, name="first")
    second_id, second = register(runs_client, runs_app, name="second")
    assert taken_ids(take(runs_client, first, 1)) == [run.id]
    assert take(runs_client, second, 1)["runs"] == []  # the take's hold
    fencing = attach(runs_client, first, run.id).json()["fencing"]
    lapse(runs_app, run.id)
    assert taken_ids(take(runs_client, second, 1)) == [run.id]
    assert run_row(runs_app, run.id).pool_learner_id == second_id
    # The first pool learner no longer reaches the run; the second attaches with a higher token.
    beat = runs_client.post(
        f"/api/v1/runs/{run.id}/learner/heartbeat", json={"fencing": fencing}, headers=first
    )
    assert (beat.status_code, beat.json()["code"]) == (403, "run_not_held")
    attached = attach(runs_client, second, run.id)
    assert attached.status_code == 200 and attached.json()["fencing"] > fencing
    assert first_id != second_id


def test_a_run_with_a_live_per_run_learner_is_never_taken(runs_app, runs_client) -> None:
    run = make_run(runs_app)
    own = runs_client.post(
        run.url("learner/attach"), json={"tokenizer_fingerprint": "tok-fp-1"}, headers=run.headers
    )
    assert own.status_code == 200
    _, pool = register(runs_client, runs_app)
    assert take(runs_client, pool, 4)["runs"] == []
    assert run_row(runs_app, run.id).pool_learner_id is None
    # Once its lease lapses the run needs a learner again: takeable.
    lapse(runs_app, run.id)
    assert taken_ids(take(runs_client, pool, 4)) == [run.id]


def test_a_per_run_learner_waits_while_a_pool_learner_holds_the_run(runs_app, runs_client) -> None:
    run = make_run(runs_app)
    _, pool = register(runs_client, runs_app)
    assert taken_ids(take(runs_client, pool, 1)) == [run.id]
    body = {"tokenizer_fingerprint": "tok-fp-1"}
    held = runs_client.post(run.url("learner/attach"), json=body, headers=run.headers)
    assert (held.status_code, held.json()["code"]) == (409, "held_by_another_learner")
    lapse(runs_app, run.id)  # the pool learner never attached: its hold ran out
    own = runs_client.post(run.url("learner/attach"), json=body, headers=run.headers)
    assert own.status_code == 200
    assert run_row(runs_app, run.id).pool_learner_id is None  # a per-run learner's again
    assert take(runs_client, pool, 1)["runs"] == []


def test_terminal_preparing_and_budget_exhausted_runs_are_not_taken(runs_app, runs_client) -> None:
    done, preparing, spent = make_run(runs_app), make_run(runs_app), make_run(runs_app)
    with transaction(runs_app.state.sessionmaker) as session:
        for run, status in (
            (done, "cancelled"),
            (preparing, "preparing"),
            (spent, "budget_exhausted"),
        ):
            session.execute(update(Run).where(Run.id == run.id).values(status=status))
    _, pool = register(runs_client, runs_app)
    assert take(runs_client, pool, 4)["runs"] == []
    with transaction(runs_app.state.sessionmaker) as session:  # its budget raised: takeable
        session.execute(update(Run).where(Run.id == spent.id).values(status="running"))
    assert taken_ids(take(runs_client, pool, 4)) == [spent.id]


def test_an_ended_run_frees_its_slot(runs_app, runs_client) -> None:
    first, second = make_run(runs_app), make_run(runs_app)
    _, pool = register(runs_client, runs_app, max_runs=1)
    held = taken_ids(take(runs_client, pool, 1))
    assert len(held) == 1
    with transaction(runs_app.state.sessionmaker) as session:
        session.execute(update(Run).where(Run.id == held[0]).values(status="completed"))
    answer = take(runs_client, pool, 1)
    assert taken_ids(answer) == [({first.id, second.id} - set(held)).pop()]
    assert answer["held"] == [str(taken_ids(answer)[0])]
