"""The pool learner's loop without a model (learner/pool.py): it takes (with its memory payload,
logging each run a take left once), trains the run it took with a Learner under its pool token,
takes again after a lost run (RunLost, not a crash), waits while nothing is takeable; and the
Learner turns a 403 `run_not_held` into RunLost."""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

import learner.loop
import learner.pool
import learner.pool_memory
from learner.config import LearnerSettings
from learner.heartbeat import Heartbeat
from learner.loop import Learner, RunLost
from protocol import credentials
from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient, ConflictError, ForbiddenError
from protocol.error_codes import ErrorCode
from protocol.learner_memory import ModelShape
from protocol.rewards import RewardAllowlist

SERVER = "http://h:1"
RUN_A, RUN_B, RUN_C = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def _taken(run_id: uuid.UUID) -> sl.TakenRun:
    return sl.TakenRun(
        run_id=run_id,
        name="r",
        status="pending",
        base_model="m",
        tokenizer_fingerprint=None,
        current_version=0,
        attach_path=f"/api/v1/runs/{run_id}/learner/attach",
    )


def _not_held() -> ForbiddenError:
    return ForbiddenError(403, "not held", {"code": ErrorCode.run_not_held})


def test_the_pool_loop_takes_again_after_a_run_lost_and_when_idle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    creds = tmp_path / "pool.json"
    credentials.save(creds, credentials.StoredCredential("id", "agr_pln_x", SERVER), "learner_id")
    settings = LearnerSettings(server_url=SERVER, credentials_file=creds, take_retry_s=0.01)
    too_big = sl.LeftRun(run_id=RUN_C, reason="needs 3.1 GB more")
    answers = [
        sl.TakeResponse(runs=[_taken(RUN_A)], held=[RUN_A], hold_s=3),
        sl.TakeResponse(runs=[], held=[], hold_s=3, left=[too_big]),
        # a lost answer's run, found held
        sl.TakeResponse(runs=[], held=[RUN_B], hold_s=3, left=[too_big]),
    ]
    shape = ModelShape("m", 30, 576, 1536, 9, 3, 49152, True, False)
    sent = sl.LearnerMemory.of(shape, budget_gb=16, weight_bytes=4)  # every take sends it

    def take(
        self: AsyncGrpoClient, max_runs: int, memory: sl.LearnerMemory | None
    ) -> sl.TakeResponse:
        assert (self.token, max_runs, memory) == ("agr_pln_x", 1, sent)
        if not answers:
            raise KeyboardInterrupt  # stands for the Ctrl-C that stops it
        return answers.pop(0)

    trained: list[tuple[str | None, str | None, bool]] = []

    class FakeLearner:
        def __init__(self, s: LearnerSettings, *, pool: bool, shared: object) -> None:
            trained.append((s.run_id, s.token, pool))
            self.tracker = type("T", (), {"close": lambda self: None})()

        def stop(self) -> None:
            pass

        def run(self) -> None:
            if len(trained) == 1:
                raise RunLost("taken from it")

    monkeypatch.setattr(AsyncGrpoClient, "take_runs", take)
    monkeypatch.setattr(learner.pool, "_fingerprint", lambda model: "fp")
    monkeypatch.setattr(learner.pool_memory, "take_memory", lambda settings: sent)
    monkeypatch.setattr(learner.loop, "Learner", FakeLearner)
    with pytest.raises(KeyboardInterrupt), caplog.at_level(logging.INFO, logger="learner"):
        learner.pool.run_pool(settings)
    assert trained == [(str(RUN_A), "agr_pln_x", True), (str(RUN_B), "agr_pln_x", True)]
    left = f"left run {RUN_C} for another learner: needs 3.1 GB more"
    assert [r.getMessage() for r in caplog.records].count(left) == 1  # once, not per take


def test_runs_are_trained_side_by_side_up_to_max_runs_and_a_crash_stays_with_its_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    creds = tmp_path / "pool.json"
    credentials.save(creds, credentials.StoredCredential("id", "agr_pln_x", SERVER), "learner_id")
    settings = LearnerSettings(
        server_url=SERVER, credentials_file=creds, take_retry_s=0.01, max_runs=2
    )
    run_c = uuid.uuid4()
    answers = [
        sl.TakeResponse(runs=[_taken(RUN_A), _taken(RUN_B)], held=[RUN_A, RUN_B], hold_s=3),
        sl.TakeResponse(runs=[_taken(run_c)], held=[RUN_A, run_c], hold_s=3),
    ]
    rooms: list[int] = []
    both_running = threading.Barrier(2, timeout=10)
    stopped: list[str] = []

    def take(self: AsyncGrpoClient, max_runs: int, **_: Any) -> sl.TakeResponse:
        rooms.append(max_runs)
        if not answers:
            raise KeyboardInterrupt  # stands for the Ctrl-C that stops it
        return answers.pop(0)

    class FakeLearner:
        def __init__(self, s: LearnerSettings, *, pool: bool, shared: object) -> None:
            self.run_id = str(s.run_id)
            self.tracker = type("T", (), {"close": lambda self: None})()
            self.stopping = threading.Event()

        def stop(self) -> None:
            stopped.append(self.run_id)
            self.stopping.set()

        def run(self) -> None:
            if self.run_id in (str(RUN_A), str(RUN_B)):
                both_running.wait()  # A and B train at the same time
            if self.run_id == str(RUN_B):
                raise RuntimeError("a bug in this run's code path")
            if self.run_id == str(RUN_A):
                self.stopping.wait(10)  # trains until the pool stops

    monkeypatch.setattr(AsyncGrpoClient, "take_runs", take)
    monkeypatch.setattr(learner.pool, "_fingerprint", lambda model: "fp")
    monkeypatch.setattr(learner.pool_memory, "take_memory", lambda settings: None)
    monkeypatch.setattr(learner.loop, "Learner", FakeLearner)
    with pytest.raises(KeyboardInterrupt):
        learner.pool.run_pool(settings)
    # B's crash freed its place: the next take asked for one run (C), then for C's place
    assert rooms[:2] == [2, 1] and rooms[2:] == [1], rooms
    assert stopped == [str(RUN_A)]  # Ctrl-C stopped the run still training


class _Client:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def learner_attach(self, *args: Any, **kwargs: Any) -> sl.AttachResponse:
        raise self.error

    def learner_heartbeat(self, run_id: str, fencing: int) -> sl.HeartbeatResponse:
        raise self.error


def _learner(error: Exception, *, pool: bool) -> Learner:
    made = Learner.__new__(Learner)
    made.settings = LearnerSettings(server_url=SERVER, run_id=str(RUN_A), token="agr_pln_x")
    made.pool = pool
    made.client = _Client(error)  # type: ignore[assignment]
    made.fingerprint = "fp"
    made.rewards_allowed = RewardAllowlist.discover([])
    made.stopped = threading.Event()
    return made


def test_a_pool_learners_attach_refused_as_not_held_or_held_is_a_lost_run() -> None:
    with pytest.raises(RunLost, match="no longer this pool learner's"):
        _learner(_not_held(), pool=True).attach()
    held = ConflictError(409, "held", {"code": ErrorCode.held_by_another_learner})
    with pytest.raises(RunLost):
        _learner(held, pool=True).attach()


def test_the_heartbeat_counts_run_not_held_as_a_lost_lease() -> None:
    beat = Heartbeat(_Client(_not_held()), str(RUN_A), 1, 0.01)  # type: ignore[arg-type]
    beat.start()
    assert beat.lost.wait(5)
    beat.stopped.set()
    beat.join(5)
