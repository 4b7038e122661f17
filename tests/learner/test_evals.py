"""The learner's eval scorer (learner/evals.py) against a real server over HTTP (SQLite, local
bucket): it claims eval batches written as a worker writes them (real Parquet, the small
model's tokenizer), validates and scores them with the run's rewards in the reward pool,
rejects an unusable one (its item goes back to the queue) and posts results the server turns
into the version's accuracy, pass@n and mean reward."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from learner.config import LearnerSettings
from learner.evals import EvalScorer
from learner.intake import Intake
from learner.tracking import Tracker
from protocol.batches import BatchMetadata, RolloutSample, write_batch
from protocol.client import AsyncGrpoClient
from protocol.run_config import LearnerRunConfig
from protocol.schemas import BatchManifest, Lease
from protocol.storage import PresignedPut
from protocol.transfer import upload_presigned
from tests.conftest import mint_token
from tests.harness.live_app import live_app
from tests.harness.runs import jsonl, run_config
from tests.server.learner.support import make_worker

pytestmark = [pytest.mark.timeout(300)]
EVAL_ROWS = [
    {"prompt": "What is 2 + 3?", "answer": "5"},
    {"prompt": "What is 1 + 1?", "answer": "2"},
]
# what the fake worker "samples" per eval prompt: one right and one wrong for the first,
# both right for the second
ANSWERS = {"5": ["5", "7"], "2": ["2", "2"]}


@pytest.fixture
def live(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    with live_app(sqlite_url, tmp_path) as served:
        yield served.base, served.app


def _config() -> dict[str, Any]:
    return run_config(
        name="eval-scorer",
        dataset=jsonl([{"prompt": "What is 4 + 4?", "answer": "8"}]),
        prompts_per_lease=1,
        prompts_per_step=1,
        max_staleness=0,
        eval={
            "dataset": jsonl(EVAL_ROWS),
            "n": 2,
            "temperature": 0.5,
            "accuracy_reward": "numeric_match",
            "max_leases_in_flight": 2,
        },
    )


def _eval_batch(
    worker: AsyncGrpoClient,
    worker_id: Any,
    lease: Lease,
    tok: Any,
    fingerprint: str,
    tmp: Path,
    *,
    bad: bool,
) -> None:
    """Write the eval lease's batch as a worker does (no behaviour log-probs; `bad`: with them,
    which the learner must refuse), upload it and complete the lease."""
    from lm.chat import encode_prompt

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    samples = []
    for p in lease.prompts:
        prompt_ids = encode_prompt(tok, p.prompt, lease.system_prompt)
        answer = next(r["answer"] for r in EVAL_ROWS if r["prompt"] == p.prompt)
        for g, text in enumerate(ANSWERS[answer]):
            ids = tok.encode(text, add_special_tokens=False) + [eos]
            logprobs = [-1.0] * len(ids) if bad else None
            samples.append(RolloutSample(p.prompt_row_id, g, prompt_ids, ids, logprobs, "stop"))
    meta = BatchMetadata(
        run_id=str(lease.run_id),
        lease_id=str(lease.lease_id),
        fencing=lease.fencing,
        worker_id=str(worker_id),
        adapter_version=lease.adapter_version,
        adapter_sha256=None,
        tokenizer_fingerprint=fingerprint,
        sampling=dict(lease.sampling),
        kind="eval",
    )
    path = tmp / f"{lease.lease_id}.parquet"
    info = write_batch(path, meta, samples)
    up = worker.upload_url(lease, size=info.bytes, sha256=info.sha256)
    upload_presigned(PresignedPut(up.url, up.headers), path)
    manifest = BatchManifest(
        key=up.key,
        sha256=info.sha256,
        size=info.bytes,
        n_samples=info.n_samples,
        n_tokens=info.n_tokens,
        generation_seconds=0.1,
    )
    assert worker.complete_lease(lease, manifest).state == "accepted"


def _eval_leases(worker: AsyncGrpoClient, count: int, timeout_s: float = 30.0) -> list[Lease]:
    """`count` eval leases; an acquire may answer 204 for a moment under load (the run's eval
    work is queued by the server's own calls), so a grant is awaited, up to `timeout_s`."""
    leases: list[Lease] = []
    deadline = time.monotonic() + timeout_s
    while len(leases) < count:
        lease = worker.acquire_lease()
        if lease is None:
            assert time.monotonic() < deadline, f"no eval lease granted in {timeout_s:.0f} s"
            time.sleep(0.2)
        elif lease.kind == "eval":
            leases.append(lease)
    return leases


def _wait(predicate: Any, what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_scorer_scores_rejects_and_the_version_closes(
    live: tuple[str, Any], small_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """…and the version's aggregates, in the answer that closed it, reach the learner's
    tracker (an MLflow file store here)."""
    from mlflow.tracking import MlflowClient

    from lm.chat import tokenizer_fingerprint

    base, app = live
    admin = AsyncGrpoClient(base, mint_token(app, "admin", name="t"))
    created = admin.create_run(_config())
    run_id, learner_token = str(created["run"]["id"]), str(created["learner_token"])
    worker_id, worker_token = make_worker(app)
    worker = AsyncGrpoClient(base, worker_token)
    fingerprint = str(tokenizer_fingerprint(small_tokenizer))
    learner = AsyncGrpoClient(base, learner_token)
    attach = learner.learner_attach(run_id, fingerprint)
    config = LearnerRunConfig.model_validate(attach.run_config)
    assert config.eval is not None
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = f"file://{tmp_path / 'mlruns'}"
    tracker = Tracker(
        LearnerSettings(
            server_url=base,
            run_id=run_id,
            token=learner_token,
            tracking_backend="mlflow",
            tracking_uri=store,
        )
    )
    tracker.start(run_id, config)

    good, bad = _eval_leases(worker, 2)
    _eval_batch(worker, worker_id, good, small_tokenizer, fingerprint, tmp_path, bad=False)
    _eval_batch(worker, worker_id, bad, small_tokenizer, fingerprint, tmp_path, bad=True)
    with Intake(
        run_id=run_id,
        config=config,
        tokenizer=small_tokenizer,
        fingerprint=fingerprint,
        work_dir=tmp_path / "learner",
    ) as intake:
        scorer = EvalScorer(
            client=learner,
            run_id=run_id,
            fencing=attach.fencing,
            intake=intake,
            config=config.eval,
            tracker=tracker,
        )
        scorer.start()
        try:
            # the good batch scored, the bad one rejected: its item is leased again
            _wait(lambda: scorer.scored == 1, "the good batch scored")
            again = _eval_leases(worker, 1)[0]
            assert [p.prompt_row_id for p in again.prompts] == [
                p.prompt_row_id for p in bad.prompts
            ]
            _eval_batch(worker, worker_id, again, small_tokenizer, fingerprint, tmp_path, bad=False)
            _wait(lambda: scorer.scored == 2, "the re-generated batch scored")
        finally:
            scorer.stop(10.0)
    version = admin.run_evals(run_id)["versions"][0]
    assert version["version"] == 0 and version["state"] == "done"
    assert version["n_samples"] == 4 and version["n_prompts"] == 2
    assert version["accuracy"] == pytest.approx(3 / 4)
    assert version["pass_at_n"] == pytest.approx(1.0)
    assert version["mean_reward"] == pytest.approx(3 / 4)
    assert not scorer.lost.is_set() and not scorer.finished.is_set()  # the run still trains
    tracker.close(30)
    assert tracker.failed is None
    client = MlflowClient(tracking_uri=store)
    (mirrored,) = client.search_runs([client.get_experiment_by_name("asyncgrpo").experiment_id])
    metrics = {
        key: [(m.step, m.value) for m in client.get_metric_history(mirrored.info.run_id, key)]
        for key in ("eval/accuracy", "eval/pass_at_n", "eval/mean_reward", "eval/n_samples")
    }
    assert metrics == {  # the first post left the version open: one point, at version 0
        "eval/accuracy": [(0, pytest.approx(3 / 4))],
        "eval/pass_at_n": [(0, 1.0)],
        "eval/mean_reward": [(0, pytest.approx(3 / 4))],
        "eval/n_samples": [(0, 4.0)],
    }
