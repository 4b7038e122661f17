"""The learner decides stop vs stand-by on an attach 409 from the error code alone: with every
message of the server reworded, each refusal still stops it or makes it wait as before (issue
26; it used to match words of the message: "run is ", "fingerprint", "--model"). A run or a
token the server refuses (404, 401) stops it too, with the server's reason (it was a traceback)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import update

import learner.loop as loop
from learner.config import LearnerSettings
from learner.loop import Learner, RunFinished
from protocol.client import AsyncGrpoClient
from protocol.rewards import RewardAllowlist
from server.db import transaction
from server.db_types import db_now
from server.models import Run, Token
from tests.server.learner.support import FP, RunHandle, expire_learner, make_run
from tests.server.reworded import reword_every_message

MODEL = "smollm2-135m-instruct"


@pytest.fixture(autouse=True)
def reworded(monkeypatch: pytest.MonkeyPatch) -> None:
    reword_every_message(monkeypatch)


def _learner(client: Any, run: RunHandle, model: str = MODEL) -> Learner:
    """The real Learner's attach loop without loading a model (see test_learner_waits.py)."""
    learner = Learner.__new__(Learner)
    learner.settings = LearnerSettings(
        server_url="http://testserver", run_id=str(run.id), token=run.token, model=model
    )
    learner.client = AsyncGrpoClient("http://testserver", run.token, http=client, max_retries=0)
    learner.fingerprint = FP
    learner.rewards_allowed = RewardAllowlist.discover([])
    learner.stopped = threading.Event()
    return learner


def _standby(monkeypatch: pytest.MonkeyPatch, on_wait: Callable[[], None]) -> list[float]:
    """The attach loop's waits, recorded; `on_wait` runs at each (it ends what blocks)."""
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        assert len(waits) < 5, "the learner stood by for good"
        on_wait()

    monkeypatch.setattr(loop, "time", SimpleNamespace(sleep=sleep))
    return waits


def _never(_: None = None) -> None:
    raise AssertionError("the learner stood by instead of stopping")


def _set_status(app: Any, run: RunHandle, status: str) -> None:
    with transaction(app.state.sessionmaker) as session:
        session.execute(update(Run).where(Run.id == run.id).values(status=status))


def _cancelled(app: Any, client: Any) -> Learner:
    run = make_run(app)
    _set_status(app, run, "cancelled")
    return _learner(client, run)


def _another_tokenizer(app: Any, client: Any) -> Learner:
    run = make_run(app)
    other = AsyncGrpoClient("http://testserver", run.token, http=client, max_retries=0)
    other.learner_attach(str(run.id), "another-fingerprint")
    return _learner(client, run)


def _another_model(app: Any, client: Any) -> Learner:
    return _learner(client, make_run(app), model="another-model")


def _a_reward_it_cannot_load(app: Any, client: Any) -> Learner:
    return _learner(client, make_run(app, rewards=[{"name": "not_installed.module:reward"}]))


def _a_run_that_does_not_exist(app: Any, client: Any) -> Learner:
    return _learner(client, RunHandle(uuid.uuid4(), make_run(app).token))  # run_not_found


def _a_token_the_server_does_not_know(app: Any, client: Any) -> Learner:
    return _learner(client, RunHandle(make_run(app).id, "agr_lrn_" + "x" * 43))  # token_invalid


def _a_revoked_token(app: Any, client: Any) -> Learner:
    run = make_run(app)
    with transaction(app.state.sessionmaker) as session:
        session.execute(update(Token).where(Token.scope_id == run.id).values(revoked_at=db_now()))
    return _learner(client, run)  # token_revoked


@pytest.mark.parametrize(
    "arrange",
    [
        _cancelled,
        _another_tokenizer,
        _another_model,
        _a_reward_it_cannot_load,
        _a_run_that_does_not_exist,
        _a_token_the_server_does_not_know,
        _a_revoked_token,
    ],
)
def test_a_refusal_a_retry_would_meet_again_stops_the_learner(
    app: Any, client: Any, monkeypatch: pytest.MonkeyPatch, arrange: Any
) -> None:
    learner = arrange(app, client)
    _standby(monkeypatch, _never)
    with pytest.raises(RunFinished, match="^reworded "):
        learner.attach()


def test_a_learner_stands_by_while_another_holds_the_run(
    app: Any, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(app)
    other = AsyncGrpoClient("http://testserver", run.token, http=client, max_retries=0)
    first = other.learner_attach(str(run.id), FP)
    waits = _standby(monkeypatch, lambda: expire_learner(app, run.id))
    attached = _learner(client, run).attach()
    assert len(waits) == 1 and attached.fencing > first.fencing


def test_a_learner_waits_while_the_run_prepares(
    app: Any, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(app)
    _set_status(app, run, "preparing")
    waits = _standby(monkeypatch, lambda: _set_status(app, run, "pending"))
    attached = _learner(client, run).attach()
    assert len(waits) == 1 and attached.fencing > 0
