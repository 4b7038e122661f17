"""Safe retries of the learner calls not covered by test_safe_retries.py (docs/architecture/
protocol.md, "Safe retries"), on both databases: a fail, an uploads request, a metrics post, a
spot check, an eval claim and an eval results post whose answers are lost after the server
committed are retried by the typed client under the same Idempotency-Key and get the first
answer: no 409, no second count, the database as the first call left it."""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import func, select

from protocol import schemas_learner as sl
from server.db import transaction
from server.models import MetricPoint, Worker
from tests.harness.batches import accepted_batch
from tests.server.evals.support import accurate, drain, eval_run_fields, worker_headers
from tests.server.learner.support import make_worker
from tests.server.learner.test_safe_retries import Learner, _retried_once
from tests.server.learner.test_safe_retries import settings as settings  # both databases


def _count(app: Any, statement: Any) -> int:
    with transaction(app.state.sessionmaker) as session:
        return int(session.execute(statement).scalar_one())


def test_a_lost_fail_answer_is_retried_into_the_same_answer_not_run_ended(app, client) -> None:
    learner = Learner(app, client, {"/learner/fail": 1})
    fencing = learner.attach()
    failed = learner.client.fail_run(str(learner.run.id), fencing, "the reward cannot load")
    assert failed.run_status == "failed"
    _retried_once(learner.link.to("/learner/fail"))
    assert learner.state() == learner.at_loss[0]
    assert learner.state()["run"][0] == "failed"


def test_a_lost_uploads_answer_is_retried_into_the_same_presigned_urls(app, client) -> None:
    learner = Learner(app, client, {"/uploads": 1})
    fencing = learner.attach()
    data = b"weights"
    body = sl.UploadsRequest(
        fencing=fencing,
        version=1,
        files=[
            sl.UploadFile(
                name="adapter_model.safetensors",
                size=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                kind="adapter",
            )
        ],
    )
    uploads = learner.client.request_uploads(str(learner.run.id), body)
    lost = _retried_once(learner.link.to("/uploads"))
    first = sl.UploadsResponse.model_validate_json(lost.body)
    assert [(u.key, u.url) for u in uploads.uploads] == [(u.key, u.url) for u in first.uploads]
    assert learner.state() == learner.at_loss[0]


def test_a_lost_metrics_answer_is_retried_without_storing_the_points_twice(app, client) -> None:
    learner = Learner(app, client, {"/metrics": 1})
    fencing = learner.attach()
    points = [sl.MetricPointIn(step=s, version=1, values={"loss": 0.1 * s}) for s in (1, 2)]
    stored = learner.client.post_learner_metrics(str(learner.run.id), fencing, points)
    assert stored.stored == 2
    _retried_once(learner.link.to("/metrics"))
    rows = select(func.count()).select_from(MetricPoint).where(MetricPoint.run_id == learner.run.id)
    assert _count(app, rows) == 2


def test_a_lost_spot_check_answer_is_retried_without_counting_it_twice(app, client) -> None:
    learner = Learner(app, client, {"/spot-checks": 1})
    fencing = learner.attach()
    worker_id, _ = make_worker(app)
    batch = accepted_batch(app, learner.run.id, worker_id, version=0)
    learner.client.claim_batches(str(learner.run.id), fencing, max_groups=100)
    check = sl.SpotCheckRequest(
        fencing=fencing,
        worker_id=worker_id,
        batch_id=batch,
        mean_abs_logprob_diff=0.001,
        n_tokens=10,
    )
    answer = learner.client.spot_check(str(learner.run.id), check)
    assert answer.spot_checks == 1
    _retried_once(learner.link.to("/spot-checks"))
    checks = select(Worker.spot_checks).where(Worker.id == worker_id)
    assert _count(app, checks) == 1  # counted once


def test_lost_eval_claim_and_results_answers_are_retried_into_the_same_answers(app, client) -> None:
    learner = Learner(app, client, {"/evals/claim": 1, "/evals": 1}, **eval_run_fields())
    fencing = learner.attach()
    _, token = make_worker(app)
    assert any(lease["kind"] == "eval" for lease in drain(client, worker_headers(token)))
    claimed = learner.client.claim_evals(str(learner.run.id), fencing, max_batches=64)
    assert claimed.batches
    lost = _retried_once(learner.link.to("/evals/claim"))
    assert len(sl.EvalClaimResponse.model_validate_json(lost.body).batches) == len(claimed.batches)
    # without the key the retry would have found them claimed: an empty answer
    assert learner.client.claim_evals(str(learner.run.id), fencing, max_batches=64).batches == []
    batch = claimed.batches[0]
    samples = [
        sl.EvalSample(
            item_id=p.item_id,
            reward=1.0,
            accuracy_value=1.0 if accurate(p.item_id) else 0.0,
        )
        for p in batch.prompts
        for _ in range(batch.n)
    ]
    body = sl.EvalResultsRequest(fencing=fencing, batch_id=batch.batch_id, samples=samples)
    learner.client.post_eval_results(str(learner.run.id), body)
    posted = _retried_once(learner.link.to("/evals"))
    assert posted.status_code == 200  # not 409 batch_not_claimed
    assert learner.state() == learner.at_loss[-1]
