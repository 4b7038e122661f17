"""Safe retries of the learner calls (docs/architecture/protocol.md, "Safe retries"), on both
databases: a claim, an attach, a reject and a publish whose answers are lost after the server
committed are retried by the typed client under the same Idempotency-Key and get the first
answer: no second claim or fencing token, no 409, the run's ledger and batches as the first call
left them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient
from protocol.idempotency import IDEMPOTENCY_HEADER, new_key
from protocol.rewards import RewardAllowlist
from server.db import transaction
from server.learner.ledger import ledger_model
from server.models import IdempotentAnswer, RolloutBatch, Run
from tests.conftest import make_settings
from tests.harness.batches import FP, accepted_batch
from tests.harness.lossy import LossyLink, Sent
from tests.server.learner.support import make_run, make_worker, publish_body, upload


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Every test here on both databases."""
    return make_settings(db_url, tmp_path / "bucket")


class Learner:
    """A run's learner: its typed client over a lossy link, and what the database held when an
    answer was lost."""

    def __init__(self, app: FastAPI, http: TestClient, lose: dict[str, int], **run: Any) -> None:
        self.app, self.http = app, http
        self.run = make_run(app, **run)
        self.at_loss: list[dict[str, Any]] = []
        self.link = LossyLink(http, lose, on_loss=lambda _sent: self.at_loss.append(self.state()))
        self.client = AsyncGrpoClient(
            "http://testserver",
            self.run.token,
            http=self.link,
            sleep=lambda _s: None,  # type: ignore[arg-type]
        )

    def state(self) -> dict[str, Any]:
        with transaction(self.app.state.sessionmaker) as session:
            run = session.get(Run, self.run.id)
            assert run is not None
            batches = session.execute(
                select(
                    RolloutBatch.id,
                    RolloutBatch.state,
                    RolloutBatch.claimed_fencing,
                    RolloutBatch.target_version,
                ).where(RolloutBatch.run_id == self.run.id)
            ).all()
            return {
                "ledger": ledger_model(session, self.run.id).model_dump(),
                "run": (run.status, run.current_version, run.learner_fencing, run.fencing_seq),
                "batches": sorted(tuple(b) for b in batches),
            }

    def attach(self) -> int:
        return self.client.learner_attach(str(self.run.id), FP).fencing

    def batch(self, version: int = 0) -> Any:
        worker_id, _ = make_worker(self.app)
        return accepted_batch(self.app, self.run.id, worker_id, version=version)


def _retried_once(sent: list[Sent]) -> Sent:
    """The lost answer, and its retry answered the same under the same key."""
    assert len(sent) == 2, sent
    lost, retried = sent
    assert lost.lost and not retried.lost
    assert lost.key is not None and lost.key == retried.key
    assert (retried.status_code, retried.body) == (lost.status_code, lost.body)
    return lost


def test_a_lost_claim_answer_is_retried_into_the_same_claim(app, client) -> None:
    learner = Learner(app, client, {"/batches/claim": 1})
    fencing = learner.attach()
    batch = learner.batch()
    claimed = learner.client.claim_batches(str(learner.run.id), fencing, max_groups=100)
    assert [b.batch_id for b in claimed.batches] == [batch]
    lost = _retried_once(learner.link.to("/batches/claim"))
    assert [b["batch_id"] for b in json.loads(lost.body)["batches"]] == [str(batch)]
    assert learner.state() == learner.at_loss[0]  # claimed once, nothing else moved
    # The claim is the learner's: its next claim finds nothing more, and the batch publishes.
    again = learner.client.claim_batches(str(learner.run.id), fencing, max_groups=100)
    assert again.batches == []


def test_a_lost_attach_answer_is_retried_into_the_same_fencing_token(app, client) -> None:
    """Without the key the retry would find its own lease live: 409 held_by_another_learner,
    a standby until the TTL."""
    learner = Learner(app, client, {"/learner/attach": 1})
    fencing = learner.attach()
    lost = _retried_once(learner.link.to("/learner/attach"))
    assert lost.status_code == 200 and json.loads(lost.body)["fencing"] == fencing
    assert learner.state() == learner.at_loss[0]
    beat = learner.client.learner_heartbeat(str(learner.run.id), fencing)
    assert beat.current_version == 0  # the token it was given holds the lease


def test_a_lost_reject_answer_is_retried_into_the_same_answer_not_a_409(app, client) -> None:
    learner = Learner(app, client, {"/reject": 1})
    fencing = learner.attach()
    batch = learner.batch()
    learner.client.claim_batches(str(learner.run.id), fencing, max_groups=100)
    rejected = learner.client.reject_batch(str(learner.run.id), str(batch), fencing, "invalid")
    assert rejected.batch_id == batch and rejected.requeued == 2
    _retried_once(learner.link.to("/reject"))
    after = learner.state()
    assert after == learner.at_loss[0]
    assert [state for _, state, *_ in after["batches"]] == ["rejected"]


def test_a_lost_publish_answer_is_retried_into_the_same_answer_not_a_409(app, client) -> None:
    learner = Learner(app, client, {"/adapters": 1})
    fencing = learner.attach()
    batch = learner.batch()
    learner.client.claim_batches(str(learner.run.id), fencing, max_groups=100)
    assert upload(client, learner.run, fencing, 1).status_code == 200
    body = sl.PublishRequest.model_validate(publish_body(learner.run, fencing, 1, [batch]))
    published = learner.client.publish_adapter(str(learner.run.id), body)
    assert (published.version, published.consumed_batches) == (1, 1)
    _retried_once(learner.link.to("/adapters"))
    after = learner.state()
    assert after == learner.at_loss[0]
    assert after["run"][1] == 1 and [s for _, s, *_ in after["batches"]] == ["consumed"]


def test_a_refusal_that_committed_part_of_its_work_leaves_its_key_to_be_taken_again(
    app, client
) -> None:
    """Attach with a reward the learner cannot load fails the run (committed) and answers 409:
    its key holds no answer, so a repeat runs again and is refused the same way, not a 500 nor
    a replay of nothing."""
    learner = Learner(app, client, {}, rewards=[{"name": "my_entry_point"}])
    headers = {**learner.run.headers, IDEMPOTENCY_HEADER: new_key()}
    body = {"tokenizer_fingerprint": FP, "reward_names": RewardAllowlist().names()}
    first = client.post(learner.run.url("learner/attach"), json=body, headers=headers)
    assert (first.status_code, first.json()["code"]) == (409, "rewards_missing")
    assert learner.state()["run"][0] == "failed"
    assert _stored_statuses(app) == [None]  # committed with the failed run, holding no answer
    again = client.post(learner.run.url("learner/attach"), json=body, headers=headers)
    assert again.status_code == 409 and again.json()["code"] in {"rewards_missing", "run_ended"}
    other = client.post(
        learner.run.url("learner/attach"), json={**body, "name": "b"}, headers=headers
    )
    assert (other.status_code, other.json()["code"]) == (422, "idempotency_key_reused")


def _stored_statuses(app: FastAPI) -> list[int | None]:
    with transaction(app.state.sessionmaker) as session:
        return list(session.execute(select(IdempotentAnswer.status_code)).scalars())
