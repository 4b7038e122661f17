"""Rules of evaluation during training (docs/architecture/run-lifecycle.md, "Evaluation during
training").

The eval ledger: the eval dataset's rows (`eval_rows`), one item per (version due, eval row)
(`eval_items`: queued -> leased -> uploaded -> scored; back to queued when the lease or batch
is lost, dropped after max_attempts) and one result per version (`eval_results`: pending ->
done). Versions 0, k, 2k, … and the final one are due. Eval leases (`kind: eval`) are pinned to
the version under evaluation, have their own bound (`eval.max_leases_in_flight`), never touch
the admission counter and are never aborted as stale. The learner claims the uploaded batches,
scores them with the run's rewards and posts per-sample values; the server aggregates per
version. After the final publish the run is `evaluating` until every due version is done.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.run_config import EvalConfig, RunConfig
from server.db_types import db_now_plus
from server.errors import Conflict, NotFound, Unprocessable
from server.evals import repository as repo
from server.events.service import raise_event
from server.leases import repository as leases_repo
from server.leases.queue import Granted
from server.models import EvalResult
from server.runs import best, lifecycle
from server.runs import service as runs
from server.runs.repository import next_fencing
from server.wakeups import LEARNER, LEASES, after_commit

# Grant policy: a run's training lease comes first whenever it is admissible, except that every
# EVAL_TURN-th grant of the run (by its fencing sequence) offers eval first; eval also gets the
# grant whenever training has nothing admissible (at its bound, or out of prompts).
EVAL_TURN = 4
EVAL_EVENT = "eval.scored"
# The eval kind's name on its leases and batches (server/evals/ledger.py EvalKind.name).
KIND = "eval"


# -- rows and due versions ---------------------------------------------------------------------


def insert_eval_rows(
    session: Session, run_id: uuid.UUID, rows: Iterable[tuple[Any, dict[str, Any]]]
) -> int:
    """Store the run's eval rows ((prompt, reference) pairs; reference columns reach only the
    learner), after any already stored, keeping at most eval.max_prompts in all. Returns how
    many were stored. Called at run creation for generator/inline eval datasets, and by a
    dataset preparation job for stored ones, before the run's first attach (which queues
    version 0)."""
    config = runs.config_of(session, run_id)
    if config.eval is None:
        raise ValueError(f"run {run_id} has no eval block")
    start = repo.row_count(session, run_id)
    limit = config.eval.max_prompts
    if limit is not None:
        rows = itertools.islice(rows, max(0, limit - start))
    return repo.insert_rows(session, run_id, rows, start)


def is_due(config: EvalConfig, version: int, final: bool) -> bool:
    return final or version % config.every_versions == 0


def queue_version(session: Session, run_id: uuid.UUID, version: int) -> bool:
    """Queue the version's eval (once; False when it already was). A version with no eval rows
    is done at once."""
    if repo.result_of(session, run_id, version) is not None:
        return False
    repo.insert_version(session, run_id, version)
    after_commit(session, LEASES)  # its items are queued
    maybe_finish(session, run_id, version)
    return True


def on_publish(
    session: Session, run_id: uuid.UUID, config: RunConfig, version: int, final: bool
) -> str | None:
    """A published version: queue its eval when due; after the final one, training is over and
    the run evaluates (or completes when nothing is left to evaluate). The run's status."""
    assert config.eval is not None
    if is_due(config.eval, version, final):
        queue_version(session, run_id, version)
    if not final:
        return None
    lifecycle.finish_training(session, run_id, "final version published; evaluating")
    _complete_when_evaluated(session, run_id)
    run = runs.get_run(session, run_id)
    session.refresh(run)
    return run.status


# -- grants (the lease engine calls these) -----------------------------------------------------


def eval_first(fencing_seq: int) -> bool:
    """Every EVAL_TURN-th grant of a run offers eval before training (see EVAL_TURN)."""
    return next_fencing(fencing_seq) % EVAL_TURN == 0


def grant(
    session: Session,
    run_id: uuid.UUID,
    worker_id: uuid.UUID,
    lease_id: uuid.UUID,
    config: RunConfig,
    seed_of: Callable[[int], int],
) -> Granted | None:
    """An eval lease of up to prompts_per_lease queued items of the oldest version with any,
    if the run's eval leases are under their bound; None otherwise. Lock order as training's
    grant: items, then the run row (which serialises the bound's count)."""
    ev = config.eval
    if ev is None:
        return None
    items = repo.lock_queued_items(session, run_id, config.prompts_per_lease)
    if not items:
        return None
    version = items[0].version
    adapter = leases_repo.adapter_version(session, run_id, version) if version > 0 else None
    if version > 0 and (adapter is None or adapter.deleted):
        return None  # retention keeps a pending version; a deleted one cannot be served
    # Count under the run row's lock, and write nothing (fencing, last_lease_at) when refused.
    if (
        not repo.lock_leasing_run(session, run_id)
        or repo.active_leases(session, run_id, KIND) >= ev.max_leases_in_flight
    ):
        return None
    taken = repo.take_fencing(session, run_id)
    if taken is None:
        return None
    fencing, fingerprint = taken
    seed = seed_of(fencing)
    leases_repo.insert_lease(
        session,
        id=lease_id,
        run_id=run_id,
        worker_id=worker_id,
        adapter_version=version,
        fencing=fencing,
        state="active",
        expires_at=db_now_plus(config.lease_ttl_s),
        seed=seed,
        n_prompts=len(items),
        group_size=ev.n,
        kind=KIND,
    )
    repo.mark_items(session, [i.id for i in items], "queued", state="leased", lease_id=lease_id)
    return Granted(
        fencing=fencing,
        seed=seed,
        version=version,
        fingerprint=fingerprint,
        rows=items,
        adapter=None if adapter is None else (adapter.sha256, adapter.files),
    )


def accept(
    session: Session,
    lease: Any,
    worker_id: uuid.UUID,
    values: dict[str, Any],
    reject: str | None,
) -> tuple[uuid.UUID, str | None]:
    """The completed eval lease's batch (kind eval): accepted with its items `uploaded`, or
    rejected with them re-queued. `values`: the batch row's columns from the manifest."""
    items = repo.items_of_lease(session, lease.id, "leased")
    if reject is None and values["n_samples"] != len(items) * lease.group_size:
        reject = "invalid"
    batch_id = leases_repo.insert_batch(
        session,
        **values,
        run_id=lease.run_id,
        lease_id=lease.id,
        worker_id=worker_id,
        adapter_version=lease.adapter_version,
        n_groups=len(items),
        tokenizer_fingerprint=lease.tokenizer_fingerprint,
        state="rejected" if reject else "accepted",
        reject_reason=reject,
        kind=KIND,
    )
    if reject is None:
        repo.mark_items(session, items, "leased", state="uploaded", batch_id=batch_id)
        after_commit(session, LEASES, LEARNER)  # a batch to claim, room under the eval bound
    else:
        requeue_leases(session, [lease.id], count_attempt=True)
    return batch_id, reject


def requeue_leases(session: Session, lease_ids: Iterable[uuid.UUID], *, count_attempt: bool) -> int:
    """The open items of these eval leases back to queued (dropped after max_attempts)."""
    return _requeue(session, repo.open_items_of_leases(session, list(lease_ids)), count_attempt)


def requeue_batch(session: Session, batch_id: uuid.UUID) -> int:
    """The uploaded items of a rejected eval batch back to queued (an attempt counted)."""
    return _requeue(session, repo.open_items_of_batch(session, batch_id), True)


def _requeue(session: Session, rows: list[Row[Any]], count_attempt: bool) -> int:
    by_run: dict[uuid.UUID, list[Row[Any]]] = defaultdict(list)
    for row in rows:
        by_run[row.run_id].append(row)
    if rows:
        after_commit(session, LEASES, LEARNER)  # items queued (or dropped)
    for run_id in sorted(by_run):
        limit = runs.config_of(session, run_id).max_attempts
        versions = repo.requeue_items(session, by_run[run_id], int(count_attempt), limit)
        for version in versions:  # dropped items may leave nothing open
            maybe_finish(session, run_id, version)
    return len(rows)


# -- scoring -----------------------------------------------------------------------------------


def maybe_finish(session: Session, run_id: uuid.UUID, version: int) -> bool:
    """Close the version's result when no item is open: its aggregates, an `eval.scored` event
    (delivered to the run's webhook) and, once nothing is pending, the evaluating run completed."""
    config = runs.config_of(session, run_id)
    assert config.eval is not None
    tally = repo.version_tally(session, run_id, version)
    if tally.open:
        return False
    samples = tally.scored * config.eval.n
    values = {
        "n_samples": samples,
        "mean_reward": float(tally.reward) / samples if samples else None,
        "accuracy": float(tally.accurate) / samples if samples else None,
        "pass_at_n": float(tally.passed) / tally.scored if tally.scored else None,
    }
    if not repo.finish_result(session, run_id, version, **values):
        return False
    raise_event(
        session,
        kind=EVAL_EVENT,
        severity="info",
        message=f"version {version} evaluated: accuracy {_pct(values['accuracy'])}, "
        f"pass@{config.eval.n} {_pct(values['pass_at_n'])} on {tally.scored} prompts",
        run_id=run_id,
        data={"version": version, "n_prompts": tally.scored, **values},
    )
    best.rank(session, run_id, version, best.eval_figure(config, values), config)
    _complete_when_evaluated(session, run_id)
    return True


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _complete_when_evaluated(session: Session, run_id: uuid.UUID) -> None:
    run = runs.get_run(session, run_id)
    session.refresh(run)
    if run.status == "evaluating" and not repo.pending_versions(session, run_id):
        lifecycle.complete(session, run_id, "final version published and evaluated")


def score(
    session: Session,
    run_id: uuid.UUID,
    batch: Any,
    samples: list[tuple[int, float, float]],
) -> bool:
    """Score a claimed eval batch from (item id, reward, accuracy value) per sample: every
    item of the batch exactly n times (422 naming the difference otherwise). True when this
    finished the batch's version."""
    config = runs.config_of(session, run_id)
    assert config.eval is not None
    n, threshold = config.eval.n, config.eval.threshold
    items = {i.id for i in repo.items_of_batch(session, batch.id)}
    counts = Counter(item_id for item_id, _r, _a in samples)
    wrong = sorted(i for i in items | set(counts) if counts.get(i, 0) != (n if i in items else 0))
    if wrong:
        raise Unprocessable(
            f"samples must hold each of the batch's {len(items)} items exactly n = {n} times "
            f"and no other item (wrong for items {wrong[:10]})",
            field="samples",
            code=ErrorCode.invalid_value,
        )
    scores: dict[int, tuple[float, int]] = {}
    for item_id, reward, accuracy_value in samples:
        total, accurate = scores.get(item_id, (0.0, 0))
        scores[item_id] = (total + reward, accurate + int(accuracy_value >= threshold))
    repo.score_items(session, scores, batch.id)
    repo.set_batch_state(
        session, batch.id, "claimed", state="consumed", consumed_version=batch.adapter_version
    )
    return maybe_finish(session, run_id, batch.adapter_version)


def batch_items(session: Session, batch_id: uuid.UUID) -> list[Row[Any]]:
    return repo.items_of_batch(session, batch_id)


def pending_count(session: Session, run_id: uuid.UUID) -> int:
    return len(repo.pending_versions(session, run_id))


def finished_result(session: Session, run_id: uuid.UUID, version: int) -> EvalResult | None:
    """The version's aggregates once every item is scored (the learner mirrors them)."""
    result = repo.result_of(session, run_id, version)
    return result if result is not None and result.state == "done" else None


def results(session: Session, run_id: uuid.UUID) -> tuple[RunConfig, list[EvalResult]]:
    run = runs.get_run(session, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found", code=ErrorCode.run_not_found)
    return runs.get_config(run), repo.results(session, run_id)


def refuse_unclaimed(batch: Any, fencing: int) -> None:
    if batch.state != "claimed" or batch.claimed_fencing != fencing:
        raise Conflict(
            f"eval batch is {batch.state}, not claimed by this learner",
            state=batch.state,
            code=ErrorCode.batch_not_claimed,
        )
