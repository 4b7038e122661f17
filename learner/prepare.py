"""The intake of one optimizer step (docs/architecture/learner.md, "The learner"): claim batches for
the version the step will be trained into, download, verify, validate, re-tokenize and score them,
reject the unusable ones, until the step has prompts_per_step groups or nothing more will come. Runs
on the intake thread while the previous step trains (learner/background.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from learner.intake import Intake, IntakeResult
from learner.refusals import Diverged, OnConflict, on_409, reject_batch
from protocol import schemas_learner as sl
from protocol.batches import BatchRejected
from protocol.client import AsyncGrpoClient, ConflictError

log = logging.getLogger(__name__)
IDLE_SLEEP_S = 0.5

# more: a full step; exhausted: the run has nothing left (train what is here, publish final);
# beyond: the step would be trained into a version past max_versions (nothing to claim)
StepEnd = Literal["more", "exhausted", "beyond"]


@dataclass
class PreparedStep:
    target_version: int
    end: StepEnd
    results: list[IntakeResult] = field(default_factory=list)
    rejected: int = 0


@dataclass
class StepPreparer:
    client: AsyncGrpoClient
    run_id: str
    fencing: int
    intake: Intake
    prompts_per_step: int
    claim_wait_s: float
    last_version: int | None  # the last version this learner may train into (None: no limit)
    alive: Callable[[], None]  # raises once the lease is lost or the session stops

    def __call__(self, target_version: int) -> PreparedStep:
        step = PreparedStep(target_version, "more")
        if self.last_version is not None and target_version > self.last_version:
            step.end = "beyond"
            return step
        groups = 0
        while groups < self.prompts_per_step:
            self.alive()
            claim = self._claim(target_version, self.prompts_per_step - groups)
            for batch in claim.batches:
                result = self._load(batch)
                if result is None:
                    step.rejected += 1
                    continue
                step.results.append(result)
                groups += len(result.groups)
            if claim.exhausted and not claim.batches:
                step.end = "exhausted"
                return step
            if not claim.batches:
                time.sleep(IDLE_SLEEP_S)  # the server may answer at once when nothing is ready
        return step

    def _claim(self, target_version: int, max_groups: int) -> sl.ClaimResponse:
        """A claim for `target_version`. `target_version_behind`: the server holds versions up
        to or past the one this session builds, which none of its publishes made (Diverged)."""
        try:
            return self.client.claim_batches(
                self.run_id,
                self.fencing,
                max_groups,
                wait_s=self.claim_wait_s,
                target_version=target_version,
            )
        except ConflictError as exc:
            if on_409("claim", exc) is OnConflict.diverged:
                raise Diverged(f"claim for version {target_version}: {exc.detail}") from exc
            raise

    def _load(self, batch: sl.ClaimedBatch) -> IntakeResult | None:
        self.alive()
        try:
            return self.intake.load(batch)
        except BatchRejected as exc:
            log.warning("rejecting batch %s: %s", batch.batch_id, exc)
            reject_batch(
                self.client,
                self.run_id,
                str(batch.batch_id),
                self.fencing,
                exc.reason,
                exc.detail[:2000],
            )
            return None
