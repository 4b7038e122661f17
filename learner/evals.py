"""Scoring eval batches beside training (docs/architecture/run-lifecycle.md, "Evaluation during
training").

A small thread of its own claims the uploaded eval batches (never training batches), validates
and scores them with the run's rewards in the same reward pool as the intake (workers never see
the reference columns: they come with the claim), and posts each sample's total reward and the
value of the eval's `accuracy_reward`; the server aggregates per version. Eval batches are few
and scoring them needs no model, so training is not stalled. After the final publish the run is
`evaluating`: the main thread waits here until the server says the run is completed."""

from __future__ import annotations

import logging
import threading

from learner.intake import Intake
from learner.refusals import OnConflict, on_409, reject_batch
from learner.reward_pool import RewardPoolClosed
from learner.tracking import Tracker
from protocol import schemas_learner as sl
from protocol.batches import BatchRejected
from protocol.client import ApiError, AsyncGrpoClient, ConflictError
from protocol.run_config import EvalConfig
from protocol.schemas import TERMINAL_RUN_STATUSES

log = logging.getLogger(__name__)
IDLE_S = 1.0  # between claims that found nothing


def eval_samples(ev: EvalConfig, batch: sl.ClaimedEvalBatch, intake: Intake) -> list[sl.EvalSample]:
    """Every sample of the batch with its total reward and accuracy_reward value (BatchRejected
    when the batch is unusable)."""
    data, rewards = intake.load_eval(batch)
    accuracy = rewards.per_reward[ev.accuracy_reward]
    return [
        sl.EvalSample(
            item_id=item_id,
            reward=_finite(rewards.total[i]),
            accuracy_value=_finite(accuracy[i]),
        )
        for i, item_id in enumerate(r.prompt_row_id for r in data.rows)
    ]


def _finite(x: float) -> float:
    """A reward that returned None (NaN) counts as 0 (and so as not accurate, for a positive
    threshold)."""
    return x if x == x and abs(x) != float("inf") else 0.0


class EvalScorer(threading.Thread):
    """Claims, scores and posts eval batches until stopped, the lease is lost (`lost`) or the
    run has ended (`finished`)."""

    def __init__(
        self,
        *,
        client: AsyncGrpoClient,
        run_id: str,
        fencing: int,
        intake: Intake,
        config: EvalConfig,
        claim_wait_s: float = 2.0,
        tracker: Tracker | None = None,
    ) -> None:
        super().__init__(daemon=True, name="learner-evals")
        self.client, self.run_id, self.fencing = client, run_id, fencing
        self.intake, self.config, self.claim_wait_s = intake, config, claim_wait_s
        self.stopped = threading.Event()
        self.lost = threading.Event()
        self.finished = threading.Event()
        self.scored = 0  # batches posted
        self.tracker = tracker  # gets each version's aggregates once the server has them

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                if not self._one_round():
                    self.stopped.wait(IDLE_S)
            except ApiError as exc:
                if not exc.lease_lost:
                    log.warning("eval scoring failed (%s); retrying", exc)
                    self.stopped.wait(IDLE_S)
                    continue
                log.warning("eval scoring: learner lease lost (%s)", exc.detail)
                self.lost.set()
                return
            except RewardPoolClosed:
                return
            except Exception:  # transient (server or bucket): try again
                log.warning("eval scoring failed; retrying", exc_info=True)
                self.stopped.wait(IDLE_S)

    def _one_round(self) -> bool:
        answer = self.client.claim_evals(
            self.run_id, self.fencing, max_batches=4, wait_s=self.claim_wait_s
        )
        for batch in answer.batches:
            self._score(batch)
        if answer.run_status in TERMINAL_RUN_STATUSES:
            self.finished.set()
            self.stopped.set()
        return bool(answer.batches)

    def _score(self, batch: sl.ClaimedEvalBatch) -> None:
        try:
            samples = eval_samples(self.config, batch, self.intake)
        except BatchRejected as exc:
            log.warning("rejecting eval batch %s: %s", batch.batch_id, exc)
            reject_batch(
                self.client,
                self.run_id,
                str(batch.batch_id),
                self.fencing,
                exc.reason,
                exc.detail[:2000],
            )
            return
        body = sl.EvalResultsRequest(fencing=self.fencing, batch_id=batch.batch_id, samples=samples)
        try:
            answer = self.client.post_eval_results(self.run_id, body)
        except ConflictError as exc:
            if on_409("eval_results", exc) is not OnConflict.done:
                raise
            # an earlier try of this post landed (its answer was lost): the batch is scored
            log.info("eval batch %s was already scored (%s)", batch.batch_id, exc.code)
            return
        self.scored += 1
        if self.tracker is not None and answer.result is not None:
            self.tracker.log_eval(answer.version, answer.result.model_dump())
        log.info(
            "eval batch %s of version %d scored%s",
            batch.batch_id,
            batch.version,
            " (the version is done)" if answer.version_done else "",
        )
        if answer.run_status in TERMINAL_RUN_STATUSES:
            self.finished.set()
            self.stopped.set()

    def stop(self, timeout_s: float) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join(timeout_s)
