"""The intake's rewards against the real server (uvicorn, Postgres, local store): batches are
claimed through the client, loaded in a background thread (as the learner's intake thread
does), and a batch on which a reward hangs is rejected `reward_error` through the client, its
prompts re-queued with an attempt counted, while the other batch scores in a fresh child; a
batch whose `llm_judge` keeps failing (a real local endpoint answering 500) is rejected the
same way."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from learner.intake import Intake
from protocol.batches import BatchRejected
from protocol.client import AsyncGrpoClient
from protocol.outbound import OutboundPolicy
from protocol.rewards import RewardAllowlist
from protocol.run_config import LearnerRunConfig
from server.db import transaction
from server.models import PromptRow, RolloutBatch
from tests.fake_judge import Reply, fake_judge
from tests.harness.batches import real_batch
from tests.harness.live_app import live_app
from tests.harness.runs import plus_rows
from tests.server.learner.support import make_run, make_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
MOD = "tests.learner.rewards_for_tests"
ROWS = plus_rows(4)


@pytest.fixture
def live(pg_url: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """The server on a free port, with a learner lease that outlasts the test (no heartbeat)."""
    with live_app(pg_url, tmp_path, learner_lease_ttl_s=300.0) as served:
        yield served.base, served.app


def _load_in_thread(intake: Intake, batch: Any) -> tuple[Any, float]:
    """Intake.load in a non-main thread: the result or the exception, and the seconds taken."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(intake.load(batch))
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=target)
    thread.start()
    thread.join(120)
    assert out, "the intake thread did not finish"
    return out[0], time.monotonic() - started


def test_a_hanging_reward_rejects_its_batch_reward_error(live, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from lm.chat import tokenizer_fingerprint
    from lm.models import load_tokenizer

    base, app = live
    # The completions are each prompt's answer and "no": `sleepy` hangs on the one batch that
    # holds the answer "2"; `by_alarm` needs its process's main thread.
    run = make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        rewards=[
            {"name": f"{MOD}:sleepy", "kwargs": {"when": "2"}},
            {"name": f"{MOD}:by_alarm", "weight": 0.5},
        ],
    )
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    for _ in range(2):
        real_batch(app, run.id, worker_id, 0, tok, tmp_path)
    client = AsyncGrpoClient(base, run.token)
    attach = client.learner_attach(str(run.id), str(tokenizer_fingerprint(tok)))
    claimed = client.claim_batches(str(run.id), attach.fencing, 4).batches
    assert len(claimed) == 2
    config = LearnerRunConfig.model_validate(attach.run_config)
    outcomes: dict[str, Any] = {}
    with Intake(
        run_id=str(run.id),
        config=config,
        tokenizer=tok,
        fingerprint=str(tokenizer_fingerprint(tok)),
        work_dir=tmp_path / "work",
        reward_timeout_s=2.0,
        rewards_allowed=RewardAllowlist(modules=frozenset({MOD})),
    ) as intake:
        for batch in claimed:
            result, seconds = _load_in_thread(intake, batch)
            answers = {str(p.reference["answer"]) for p in batch.prompts}
            outcomes["hang" if "2" in answers else "good"] = (batch, result, seconds)
    bad, rejected, seconds = outcomes["hang"]
    assert isinstance(rejected, BatchRejected), rejected
    assert (rejected.reason, rejected.check) == ("reward_error", "reward")
    assert f"{MOD}:sleepy" in rejected.detail and "within 2 s (timeout)" in rejected.detail
    assert seconds < 10
    _, good, _ = outcomes["good"]
    assert not isinstance(good, BaseException), good
    lengths = good.rewards_by_name[f"{MOD}:by_alarm"]
    assert good.rewards_by_name[f"{MOD}:sleepy"] == [1.0] * len(lengths)
    assert [g.rewards for g in good.groups] == [
        [1.0 + 0.5 * lengths[i], 1.0 + 0.5 * lengths[i + 1]] for i in range(0, len(lengths), 2)
    ]
    answer = client.reject_batch(
        str(run.id), str(bad.batch_id), attach.fencing, rejected.reason, rejected.detail
    )
    assert (answer.requeued, answer.dropped) == (2, 0)
    with transaction(app.state.sessionmaker) as session:
        row = session.get(RolloutBatch, bad.batch_id)
        assert row is not None
        assert (row.state, row.reject_reason) == ("rejected", "reward_error")
        assert row.reject_detail is not None and "sleepy" in row.reject_detail
        requeued = session.execute(
            select(PromptRow.state, PromptRow.attempts).where(
                PromptRow.run_id == run.id, PromptRow.last_requeue_reason == "reward_error"
            )
        ).all()
    assert sorted(requeued) == [("queued", 1), ("queued", 1)]


def test_a_judge_that_keeps_failing_rejects_its_batch_reward_error(live, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`llm_judge` through the learner's scoring path: the fake judge answers 500 to every
    request; after its retry the batch is rejected `reward_error` and its prompts re-queued."""
    from lm.chat import tokenizer_fingerprint
    from lm.models import load_tokenizer

    base, app = live
    with fake_judge(lambda body, n: Reply(status=500)) as judge:
        run = make_run(
            app,
            dataset={"kind": "jsonl", "rows": ROWS[:2]},
            rewards=[
                {"name": "numeric_match"},
                {
                    "name": "llm_judge",
                    "kwargs": {"base_url": judge.url, "model": "m", "max_retries": 1},
                },
            ],
        )
        worker_id, _ = make_worker(app)
        tok = load_tokenizer("smollm2-135m-instruct")
        real_batch(app, run.id, worker_id, 0, tok, tmp_path)
        client = AsyncGrpoClient(base, run.token)
        attach = client.learner_attach(str(run.id), str(tokenizer_fingerprint(tok)))
        (claimed,) = client.claim_batches(str(run.id), attach.fencing, 4).batches
        with Intake(
            run_id=str(run.id),
            config=LearnerRunConfig.model_validate(attach.run_config),
            tokenizer=tok,
            fingerprint=str(tokenizer_fingerprint(tok)),
            work_dir=tmp_path / "work",
            reward_timeout_s=30.0,
            outbound=OutboundPolicy(allow_private=True),
        ) as intake:
            rejected, _ = _load_in_thread(intake, claimed)
        assert len(judge.requests) >= 2  # a first try and a retry of at least one completion
    assert isinstance(rejected, BatchRejected), rejected
    assert (rejected.reason, rejected.check) == ("reward_error", "reward")
    assert "reward 'llm_judge'" in rejected.detail and "answered 500" in rejected.detail
    answer = client.reject_batch(
        str(run.id), str(claimed.batch_id), attach.fencing, rejected.reason, rejected.detail
    )
    assert (answer.requeued, answer.dropped) == (2, 0)
    with transaction(app.state.sessionmaker) as session:
        row = session.get(RolloutBatch, claimed.batch_id)
        assert row is not None and (row.state, row.reject_reason) == ("rejected", "reward_error")
