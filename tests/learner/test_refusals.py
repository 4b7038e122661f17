"""The learner's 409s handled by their codes (learner/refusals.py; docs/architecture/learner.md,
"Refusals by code"), against the served app on both databases: the publish thread (a real
Publisher with a tiny PEFT model) reconciles a `version_not_next` after a lost answer and keeps
going under the same fencing token, uploads again a file the bucket lacks, and raises Diverged
(never a lost lease) when the server's record does not fit; a rejection that already landed is
done; a claim behind the server's version is Diverged."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from sqlalchemy import select

from learner.prepare import StepPreparer
from learner.publisher import Published, Publisher, PublishJob
from learner.refusals import Diverged, reject_batch
from learner.transfers import Retrier
from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient, ConflictError
from protocol.error_codes import ErrorCode
from server.db import transaction
from server.models import AdapterVersion, RolloutBatch, Run
from tests.harness.batches import FP, accepted_batch
from tests.harness.live_app import LiveApp, live_app
from tests.server.learner.support import make_run, make_worker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[LiveApp]:
    with live_app(db_url, tmp_path, learner_lease_ttl_s=60.0) as app:
        yield app


@pytest.fixture(scope="module")
def tiny_model() -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    lora = LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    return get_peft_model(LlamaForCausalLM(config), lora)


class Session:
    """One attachment to a fresh run: the client, its fencing token and a batch it claimed."""

    def __init__(self, served: LiveApp, tmp: Path, model: Any) -> None:
        self.app = served.app
        run = make_run(self.app)
        self.run_id = run.id
        worker_id, _ = make_worker(self.app)
        self.batches = [accepted_batch(self.app, run.id, worker_id, 0) for _ in range(2)]
        self.client = AsyncGrpoClient(served.base, run.token, max_retries=0)
        self.fencing = self.client.learner_attach(str(run.id), FP).fencing
        claimed = self.client.claim_batches(str(run.id), self.fencing, 1, target_version=1)
        self.claimed = [b.batch_id for b in claimed.batches]
        self.publisher = Publisher(
            client=self.client,
            retrier=Retrier(lambda: None, base_s=0.01, cap_s=0.05),
            run_id=str(run.id),
            fencing=self.fencing,
            model=model,
            work_dir=tmp / "work",
            adapter_sha256={},
        )

    def job(self, version: int, consumed: list[uuid.UUID], *, seed: int = 0) -> PublishJob:
        torch.manual_seed(seed)
        weights = {
            name: torch.randn_like(p)
            for name, p in self.publisher.model.named_parameters()
            if p.requires_grad
        }
        return PublishJob(version, weights, None, consumed, version, {}, final=False)

    def versions(self) -> list[int]:
        with transaction(self.app.state.sessionmaker) as session:
            return list(
                session.execute(
                    select(AdapterVersion.version)
                    .where(AdapterVersion.run_id == self.run_id)
                    .order_by(AdapterVersion.version)
                ).scalars()
            )

    def run_row(self) -> tuple[int, int | None]:
        with transaction(self.app.state.sessionmaker) as session:
            run = session.get(Run, self.run_id)
            assert run is not None
            return run.current_version, run.learner_fencing

    def consumed_version(self, batch_id: uuid.UUID) -> int | None:
        with transaction(self.app.state.sessionmaker) as session:
            batch = session.get(RolloutBatch, batch_id)
            assert batch is not None
            return batch.consumed_version

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def attached(served: LiveApp, tmp_path: Path, tiny_model: Any) -> Iterator[Session]:
    session = Session(served, tmp_path, tiny_model)
    yield session
    session.close()


def _lose_first_answer(
    client: AsyncGrpoClient, monkeypatch: pytest.MonkeyPatch, *, same_key: bool
) -> list[str]:
    """The first publish reaches the server and lands; its answer is lost on the way back. The
    learner's retry sends the publish's key again; `same_key` False sends it under a new one
    (as when the key is past its retention)."""
    real = client.publish_adapter
    calls: list[str] = []

    def publish(run_id: str, body: sl.PublishRequest, **kwargs: Any) -> sl.PublishResponse:
        if calls and not same_key:
            kwargs.pop("idempotency_key")
        try:
            answer = real(run_id, body, **kwargs)
        except ConflictError as exc:
            calls.append(str(exc.code))
            raise
        calls.append("landed" if not calls else "stored answer")
        if len(calls) == 1:
            raise httpx.ReadTimeout("the answer was lost")
        return answer

    monkeypatch.setattr(client, "publish_adapter", publish)
    return calls


def test_a_lost_publish_answer_is_answered_by_the_retry_under_its_key(
    attached: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = attached
    calls = _lose_first_answer(s.client, monkeypatch, same_key=True)
    published = s.publisher(s.job(1, s.claimed))
    assert calls == ["landed", "stored answer"] and published == Published(1, "running")
    assert s.versions() == [1] and s.run_row() == (1, s.fencing)
    assert s.consumed_version(s.claimed[0]) == 1


def test_version_not_next_after_a_lost_answer_keeps_the_session(
    attached: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = attached
    calls = _lose_first_answer(s.client, monkeypatch, same_key=False)
    published = s.publisher(s.job(1, s.claimed))
    # the retry was answered version_not_next; the version is ours, so it is taken as published
    assert calls == ["landed", "version_not_next"] and published == Published(1, "running")
    assert s.versions() == [1] and s.run_row() == (1, s.fencing)
    assert s.consumed_version(s.claimed[0]) == 1
    # no re-attach: the same session claims, trains on and publishes its next version
    claimed = s.client.claim_batches(str(s.run_id), s.fencing, 1, target_version=2)
    nxt = [b.batch_id for b in claimed.batches]
    assert len(nxt) == 1
    assert s.publisher(s.job(2, nxt, seed=1)) == Published(2, "running")
    assert s.versions() == [1, 2] and s.run_row() == (2, s.fencing)
    assert s.consumed_version(nxt[0]) == 2


def test_version_not_next_for_a_history_that_is_not_ours_is_diverged(attached: Session) -> None:
    s = attached
    assert s.publisher(s.job(1, s.claimed)).version == 1
    with pytest.raises(Diverged, match="not this session's"):  # other weights as version 1
        s.publisher(s.job(1, [], seed=7))
    with pytest.raises(Diverged, match="at version 1"):  # a version past the next one
        s.publisher(s.job(3, [], seed=8))
    assert s.versions() == [1] and s.run_row() == (1, s.fencing)
    assert s.client.learner_heartbeat(str(s.run_id), s.fencing).current_version == 1


@pytest.mark.parametrize(
    ("damage", "code"),
    [("delete", ErrorCode.file_not_uploaded), ("truncate", ErrorCode.file_size_mismatch)],
)
def test_a_file_the_bucket_lacks_at_publish_is_uploaded_again(
    attached: Session, monkeypatch: pytest.MonkeyPatch, damage: str, code: ErrorCode
) -> None:
    s = attached
    store = s.app.state.store
    real = s.client.publish_adapter
    answers: list[str] = []

    def publish(run_id: str, body: sl.PublishRequest, **kwargs: Any) -> sl.PublishResponse:
        if not answers:  # the bucket loses (or another writer shortens) the weights file
            key = next(f.key for f in body.files if f.name == "adapter_model.safetensors")
            if damage == "delete":
                store.delete(key)
            else:
                store.put_bytes(key, b"short")
        try:
            answer = real(run_id, body, **kwargs)
        except ConflictError as exc:
            answers.append(str(exc.code))
            raise
        answers.append("published")
        return answer

    monkeypatch.setattr(s.client, "publish_adapter", publish)
    assert s.publisher(s.job(1, s.claimed)) == Published(1, "running")
    assert answers == [code, "published"]
    assert s.versions() == [1] and s.run_row() == (1, s.fencing)
    with transaction(s.app.state.sessionmaker) as session:
        row = session.execute(
            select(AdapterVersion).where(AdapterVersion.run_id == s.run_id)
        ).scalar_one()
        meta = row.files["adapter_model.safetensors"]
    info = store.head(meta["key"])
    assert info is not None and info.size == meta["bytes"]


def test_a_publish_naming_batches_not_claimed_is_diverged(attached: Session) -> None:
    s = attached
    unclaimed = s.batches[1] if s.batches[1] not in s.claimed else s.batches[0]
    with pytest.raises(Diverged, match="not claimed"):
        s.publisher(s.job(1, [*s.claimed, unclaimed]))
    assert s.versions() == [] and s.run_row() == (0, s.fencing)


def test_a_rejection_that_already_landed_is_done_and_a_lost_lease_is_raised(
    attached: Session,
) -> None:
    s = attached
    rid, batch = str(s.run_id), str(s.claimed[0])
    reject_batch(s.client, rid, batch, s.fencing, "invalid", "first try")
    reject_batch(s.client, rid, batch, s.fencing, "invalid", "its retry")  # batch_not_claimed
    with pytest.raises(ConflictError) as lost:
        reject_batch(s.client, rid, batch, s.fencing + 1, "invalid", "not our token")
    assert lost.value.lease_lost and lost.value.code == ErrorCode.fencing_lost
    assert s.run_row() == (0, s.fencing)


def test_a_claim_behind_the_servers_version_is_diverged(attached: Session) -> None:
    s = attached
    assert s.publisher(s.job(1, s.claimed)).version == 1
    preparer = StepPreparer(
        client=s.client,
        run_id=str(s.run_id),
        fencing=s.fencing,
        intake=None,  # type: ignore[arg-type]  # nothing is claimed, so nothing is loaded
        prompts_per_step=1,
        claim_wait_s=0.0,
        last_version=None,
        alive=lambda: None,
    )
    with pytest.raises(Diverged, match="claim for version 1"):
        preparer(1)
    assert s.run_row() == (1, s.fencing)
