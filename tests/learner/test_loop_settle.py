"""learner/loop.py, Session's waits after a heartbeat's 409: completing the run ends the learner
lease, so the 409 can reach the main thread before the publish (or the eval answer) that
completed the run has been handed back. The session then ends as completed; a 409 for any other
reason still raises LeaseLost."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from learner.background import Pending
from learner.loop import LeaseLost, Session
from learner.publisher import Published

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _short_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("learner.loop.SETTLE_S", 3.0)


class _Frozen:
    def __init__(self) -> None:
        self.pruned: list[int] = []

    def prune(self, version: int) -> None:
        self.pruned.append(version)


def _session(publish: Any) -> Any:
    """The attributes _wait_publish reads, with the publish running on a thread as in overlap."""
    session = SimpleNamespace(
        heartbeat=SimpleNamespace(lost=threading.Event()),
        stopping=threading.Event(),
        frozen=_Frozen(),
        evals=None,
        last_publish_s=0.0,
    )
    for name in (
        "_lease_ended_by_the_server",
        "_publish_that_ended_the_run",
        "_wait_evaluated",
        "_check_open",
    ):
        setattr(session, name, getattr(Session, name).__get__(session))
    session.saw_409 = threading.Event()  # the main thread's lease check has raised

    def check_lease() -> None:
        try:
            Session._check_lease(session)
        except LeaseLost:
            session.saw_409.set()
            raise

    session._check_lease = check_lease
    session.publishing = Pending("learner-publish", lambda: publish(session), background=True)
    return session


def _answer_after_the_409(status: str) -> Any:
    """The server has ended the lease: the heartbeat sees 409 first, then the answer arrives."""

    def publish(session: Any) -> Published:
        session.heartbeat.lost.set()
        assert session.saw_409.wait(30)  # the publish's answer arrives after the 409
        return Published(version=5, run_status=status)

    return publish


def test_a_409_caused_by_the_final_publish_ends_the_session_as_completed() -> None:
    session = _session(_answer_after_the_409("completed"))
    assert Session._wait_publish(session) is True
    assert session.frozen.pruned == [5] and session.publishing is None


def test_a_409_beside_a_publish_that_did_not_end_the_run_is_a_lost_lease() -> None:
    session = _session(_answer_after_the_409("running"))
    with pytest.raises(LeaseLost, match="409"):
        Session._wait_publish(session)


def test_a_409_beside_a_failed_publish_is_a_lost_lease() -> None:
    def publish(session: Any) -> Published:
        session.heartbeat.lost.set()
        assert session.saw_409.wait(30)  # the 409 reaches the main thread first
        raise RuntimeError("409 stale fencing token")

    session = _session(publish)
    with pytest.raises(LeaseLost, match="409"):
        Session._wait_publish(session)


def test_a_stopping_session_does_not_wait_for_the_publish() -> None:
    release = threading.Event()

    def publish(session: Any) -> Published:
        release.wait(30)
        return Published(version=5, run_status="completed")

    session = _session(publish)
    session.stopping.set()
    with pytest.raises(LeaseLost, match="stopping"):
        Session._wait_publish(session)
    assert not session.publishing.done  # it raised at once, not after the settle wait
    release.set()


def test_a_409_caused_by_the_last_eval_answer_ends_the_session_as_completed() -> None:
    session = _session(_answer_after_the_409("running"))
    finished = threading.Event()
    session.evals = SimpleNamespace(
        finished=finished, lost=threading.Event(), is_alive=lambda: True
    )
    session.heartbeat.lost.set()
    # the scorer gets "completed" after the main thread has seen the 409
    threading.Thread(target=lambda: session.saw_409.wait(30) and finished.set()).start()
    assert Session._wait_evaluated(session) is True


def test_a_409_while_evaluating_with_no_answer_coming_is_a_lost_lease() -> None:
    session = _session(_answer_after_the_409("running"))
    session.evals = SimpleNamespace(
        finished=threading.Event(), lost=threading.Event(), is_alive=lambda: True
    )
    session.heartbeat.lost.set()
    with pytest.raises(LeaseLost, match="409"):
        Session._wait_evaluated(session)
