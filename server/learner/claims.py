"""The learner's claims by kind of the work ledger (server/leases/kinds.py): what a claim of each
kind asks, takes and answers. The claim itself, for every kind, is one pipeline
(server/learner/service.py `claim`, its batches from server/leases/ledger.py `claim_page`,
its long poll server/learner/router.py `waiting_claim`); a kind's differences are its policy
here, never a test of the kind at a call site (docs/architecture/lease-engine.md, "The
learner's claims")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.run_config import RunConfig
from protocol.schemas_learner import (
    ClaimedBatch,
    ClaimedEvalBatch,
    ClaimRequest,
    ClaimResponse,
    EvalClaimRequest,
    EvalClaimResponse,
    EvalPromptOut,
    PromptRowOut,
)
from protocol.staleness import outside_window, staleness, trained_on
from protocol.storage import ObjectStore
from server.errors import Conflict, Unprocessable
from server.evals import service as evals
from server.evals.ledger import EVAL
from server.learner import repository as repo
from server.leases.kinds import WorkKind
from server.leases.train import TRAIN
from server.models import RolloutBatch

# The learner holds at most a version uploading, a step training and the next step prefetched.
MAX_TARGET_AHEAD = 3

Body = TypeVar("Body", contravariant=True)
Answer = TypeVar("Answer")


@dataclass(frozen=True)
class Plan:
    """What one claim attempt may take: `budget` in the kind's cost (`ClaimPolicy.cost`), for
    `target`, the version its batches are trained into (None: the kind records none)."""

    budget: int
    target: int | None = None


# A claimed batch and the staleness recorded with its claim (None: the kind records none).
Taken = list[tuple[RolloutBatch, int | None]]


class ClaimPolicy(Protocol, Generic[Body, Answer]):
    """One kind's claim: the pipeline asks it, never tests the kind."""

    kind: WorkKind  # whose batches the claim takes (`kind.trained` picks the page)

    def plan(self, run: repo.FencedRun, config: RunConfig, body: Body) -> Plan | None:
        """What the attempt may take (None: nothing, the answer says why); raises the kind's
        refusals of the request."""
        ...

    def cost(self, batch: RolloutBatch) -> int:
        """What a batch spends of the plan's budget."""
        ...

    def lag(self, plan: Plan, batch: RolloutBatch) -> int | None:
        """The staleness recorded with the batch's claim (None: the kind records none)."""
        ...

    def outside(self, config: RunConfig, plan: Plan, batch: RolloutBatch) -> bool:
        """Whether the batch is rejected `stale` at the claim instead of claimed."""
        ...

    def answer(
        self,
        session: Session,
        store: ObjectStore,
        ttl_s: int,
        run: repo.FencedRun,
        config: RunConfig,
        taken: Taken,
        plan: Plan | None,
        stale: int,
    ) -> Answer:
        """The claim's answer: the batches taken (download URLs valid ttl_s) and the state
        the learner reads beside them."""
        ...

    def settled(self, answer: Answer) -> bool:
        """Whether an answer without batches still ends the long poll (nothing will come)."""
        ...


class TrainingClaim:
    """`POST batches/claim`: accepted training batches for a target version, inside the
    staleness window seen from it, up to `max_groups` groups."""

    kind: WorkKind = TRAIN

    def plan(self, run: repo.FencedRun, config: RunConfig, body: ClaimRequest) -> Plan | None:
        target = target_version(run.current_version, body.target_version)
        if config.max_versions is not None and target > config.max_versions:
            return None
        return Plan(budget=body.max_groups, target=target)

    def cost(self, batch: RolloutBatch) -> int:
        return batch.n_groups

    def lag(self, plan: Plan, batch: RolloutBatch) -> int | None:
        assert plan.target is not None
        return staleness(trained_on(plan.target), batch.adapter_version)

    def outside(self, config: RunConfig, plan: Plan, batch: RolloutBatch) -> bool:
        assert plan.target is not None
        return outside_window(trained_on(plan.target), batch.adapter_version, config.max_staleness)

    def answer(
        self,
        session: Session,
        store: ObjectStore,
        ttl_s: int,
        run: repo.FencedRun,
        config: RunConfig,
        taken: Taken,
        plan: Plan | None,
        stale: int,
    ) -> ClaimResponse:
        if plan is None:  # past max_versions
            return ClaimResponse(batches=[], exhausted=True, current_version=run.current_version)
        prompts = repo.prompts_of_batches(session, [b.id for b, _ in taken])
        batches = [
            ClaimedBatch(
                **_download(store, batch, ttl_s),
                adapter_version=batch.adapter_version,
                staleness=lag,
                target_version=plan.target,
                n_groups=batch.n_groups,
                prompts=[PromptRowOut(**p) for p in prompts[batch.id]],
            )
            for batch, lag in taken
        ]
        return ClaimResponse(
            batches=batches,
            exhausted=repo.open_rows(session, run.id) == 0,
            current_version=run.current_version,
            stale_rejected=stale,
        )

    def settled(self, answer: ClaimResponse) -> bool:
        return answer.exhausted


class EvalClaim:
    """`POST evals/claim`: accepted eval batches, oldest version first, up to `max_batches`;
    never rejected stale (an eval lease is pinned to its version)."""

    kind: WorkKind = EVAL

    def plan(self, run: repo.FencedRun, config: RunConfig, body: EvalClaimRequest) -> Plan | None:
        return None if config.eval is None else Plan(budget=body.max_batches)

    def cost(self, batch: RolloutBatch) -> int:
        return 1

    def lag(self, plan: Plan, batch: RolloutBatch) -> int | None:
        return None

    def outside(self, config: RunConfig, plan: Plan, batch: RolloutBatch) -> bool:
        return False

    def answer(
        self,
        session: Session,
        store: ObjectStore,
        ttl_s: int,
        run: repo.FencedRun,
        config: RunConfig,
        taken: Taken,
        plan: Plan | None,
        stale: int,
    ) -> EvalClaimResponse:
        batches = []
        if config.eval is not None:
            max_new = config.eval.max_new_tokens or config.sampling.max_new_tokens
            batches = [
                ClaimedEvalBatch(
                    **_download(store, batch, ttl_s),
                    version=batch.adapter_version,
                    n=config.eval.n,
                    max_new_tokens=max_new,
                    prompts=[
                        EvalPromptOut(
                            item_id=i.id,
                            eval_row_id=i.eval_row_id,
                            prompt=i.prompt,
                            reference=i.reference or {},
                        )
                        for i in evals.batch_items(session, batch.id)
                    ],
                )
                for batch, _lag in taken
            ]
        pending = evals.pending_count(session, run.id)
        return EvalClaimResponse(batches=batches, run_status=run.status, pending_versions=pending)

    def settled(self, answer: EvalClaimResponse) -> bool:
        return answer.pending_versions == 0


TRAINING = TrainingClaim()
EVALUATION = EvalClaim()


def _download(store: ObjectStore, batch: RolloutBatch, ttl_s: int) -> dict[str, Any]:
    """What every kind's claimed batch carries: where its object lies and how to check it."""
    return {
        "batch_id": batch.id,
        "lease_id": batch.lease_id,
        "worker_id": batch.worker_id,
        "bucket_key": batch.bucket_key,
        "sha256": batch.sha256,
        "size": batch.bytes,
        "url": store.presign_get(batch.bucket_key, ttl_s),
        "n_samples": batch.n_samples,
    }


def target_version(current: int, requested: int | None) -> int:
    """The version the claimed batches will be trained into: current + 1 unless the learner
    names one up to current + 3. A target a publish has meanwhile reached is a conflict the
    learner reacts to (claim for a later version); one too far ahead is a bad request."""
    if requested is None:
        return current + 1
    if requested <= current:
        raise Conflict(
            f"target_version {requested} is not above current_version {current}: a publish "
            "landed meanwhile; claim for a later version",
            current_version=current,
            target_version=requested,
            code=ErrorCode.target_version_behind,
        )
    if requested > current + MAX_TARGET_AHEAD:
        raise Unprocessable(
            f"target_version must be at most current_version + {MAX_TARGET_AHEAD} = "
            f"{current + MAX_TARGET_AHEAD}, got {requested}",
            field="target_version",
            current_version=current,
            code=ErrorCode.target_version_too_far,
        )
    return requested
