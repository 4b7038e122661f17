"""The `run_prep` job: a run on a stored dataset (uploaded or hf) is created `preparing`; once
its dataset is ready, the dataset's rows are read with the run's column mapping
(server.datasets.service.iter_mapped_rows) and inserted as the run's dataset rows in chunks
(one transaction each: SQLite's one write lock is never held for long), then every epoch's
prompt rows are made and the run moves to `pending` in one final transaction. A pass that dies
half-way leaves the run `preparing`; the next pass deletes the partial rows and starts again.
A failed dataset, or a row that cannot be used, fails the run with the reason. A stored eval
dataset (runs.eval_dataset_id) is read the same way into the run's eval rows, at most
eval.max_prompts of them, before the run is pending (its first attach queues version 0)."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from protocol.datasets import DatasetError
from protocol.run_config import (
    EvalConfig,
    HfDataset,
    RunConfig,
    StoredDataset,
    UploadedDataset,
    check_prompt_rows,
)
from protocol.storage import ObjectStore
from server.config import DatasetSettings
from server.datasets import repository as datasets_repo
from server.datasets import service as datasets
from server.db import transaction
from server.events.service import raise_event
from server.models import Dataset
from server.runs import lifecycle, repository
from server.runs.service import store_eval_rows

log = logging.getLogger("asyncgrpo.jobs.run_prep")


def prepare_runs(
    factory: sessionmaker[Session], store: ObjectStore, limits: DatasetSettings
) -> int:
    """Prepare every run whose dataset is ready (or fail it); returns how many moved."""
    with transaction(factory) as session:
        ids = repository.preparing_ids(session)
    return sum(prepare_one(factory, store, limits, run_id) for run_id in ids)


@dataclass(frozen=True)
class _Part:
    """One stored dataset a preparing run reads: its training data or its eval data."""

    dataset: Dataset | None
    spec: StoredDataset


def _part(session: Session, dataset_id: uuid.UUID | None, spec: Any) -> _Part | None:
    if dataset_id is None or not isinstance(spec, UploadedDataset | HfDataset):
        return None  # not a stored kind: its rows were made at creation
    return _Part(datasets_repo.get(session, dataset_id), spec)


def prepare_one(
    factory: sessionmaker[Session], store: ObjectStore, limits: DatasetSettings, run_id: uuid.UUID
) -> bool:
    """Make the rows of a preparing run once every stored dataset it names (training, eval) is
    ready: training rows and every epoch's prompt rows, eval rows (at most eval.max_prompts)."""
    with transaction(factory) as session:
        run = repository.get(session, run_id)
        if run is None or run.status != "preparing":
            return False
        config = RunConfig.model_validate(run.config)
        train = _part(session, run.dataset_id, config.dataset)
        held_out = _part(session, run.eval_dataset_id, config.eval and config.eval.dataset)
    parts = [p for p in (train, held_out) if p is not None]
    if not parts or any(p.dataset is None or p.dataset.status == "pending" for p in parts):
        return False
    for part in parts:
        failed = part.dataset
        if failed is not None and failed.status == "failed":
            return _fail(factory, run_id, f"dataset {failed.id} failed: {failed.reason}")
    try:
        n_rows = None
        _check_reward_columns(config, train, "the dataset")
        _check_reward_columns(config, held_out, "the eval dataset")
        if train is not None:
            assert train.dataset is not None
            _check(train.dataset, train.spec, config.epochs)
            with transaction(factory) as session:
                repository.delete_rows(session, run_id)
            n_rows = _insert_rows(factory, store, limits, run_id, train.dataset, train.spec)
            if n_rows is None:
                return False  # the run left `preparing` (cancelled) meanwhile
        if held_out is not None:
            assert held_out.dataset is not None
            _check(held_out.dataset, held_out.spec, 0)
            assert config.eval is not None
            _check_eval_size(config.eval, held_out.dataset)
            _insert_eval_rows(factory, store, limits, run_id, held_out.dataset, held_out.spec)
    except DatasetError as exc:
        return _fail(factory, run_id, str(exc))
    return _queue(factory, run_id, n_rows, config.epochs)


def _check_reward_columns(config: RunConfig, part: _Part | None, where: str) -> None:
    if part is not None and part.dataset is not None:
        why = datasets.missing_reward_column(config, part.dataset, part.spec, where)
        if why is not None:
            raise DatasetError(why)


def _insert_eval_rows(
    factory: sessionmaker[Session],
    store: ObjectStore,
    limits: DatasetSettings,
    run_id: uuid.UUID,
    dataset: Dataset,
    spec: StoredDataset,
) -> None:
    """The eval rows, in one transaction (at most eval.max_prompts of them: the reader stops
    there, a large test split is not read to its end)."""
    rows = datasets.iter_mapped_rows(store, dataset, spec, max_row_bytes=limits.max_row_bytes)
    with transaction(factory) as session:
        store_eval_rows(session, run_id, rows, replace=True)


def _check(dataset: Dataset, spec: StoredDataset, epochs: int) -> None:
    missing = datasets.missing_column(dataset, spec)
    if missing is not None:
        raise DatasetError(missing[1])
    try:
        check_prompt_rows(epochs, int(dataset.row_count or 0))
    except ValueError as exc:
        raise DatasetError(str(exc)) from None


def _check_eval_size(eval_config: EvalConfig, dataset: Dataset) -> None:
    try:
        eval_config.check_stored_rows(int(dataset.row_count or 0))
    except ValueError as exc:
        raise DatasetError(f"eval: {exc}") from None


def _chunks(rows: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(itertools.islice(rows, size)):
        yield chunk


def _insert_rows(
    factory: sessionmaker[Session],
    store: ObjectStore,
    limits: DatasetSettings,
    run_id: uuid.UUID,
    dataset: Dataset,
    spec: StoredDataset,
) -> int | None:
    rows = datasets.iter_mapped_rows(store, dataset, spec, max_row_bytes=limits.max_row_bytes)
    n_rows = 0
    for chunk in _chunks(rows, limits.prepare_chunk_rows):
        with transaction(factory) as session:
            if repository.status_of(session, run_id) != "preparing":
                return None
            n_rows += repository.insert_dataset_rows(session, run_id, chunk, start=n_rows)
    return n_rows


def _queue(
    factory: sessionmaker[Session], run_id: uuid.UUID, n_rows: int | None, epochs: int
) -> bool:
    """Every epoch's prompt rows (when this pass made the dataset rows: n_rows set) and
    preparing → pending, in one transaction; nothing when the dataset rows are not exactly
    0..n_rows-1 (another pass interfered: the next one redoes)."""
    with transaction(factory) as session:
        if n_rows is not None:
            if repository.dataset_row_span(session, run_id) != (n_rows, n_rows):
                log.warning("run %s: dataset rows changed during preparation; again", run_id)
                return False
            repository.insert_prompt_rows(session, run_id, n_rows, epochs)
        if not lifecycle.move(session, run_id, "prepared", None):
            session.rollback()
            return False
        raise_event(
            session,
            kind="run.status",
            severity="info",
            message=_prepared_message(n_rows, epochs),
            run_id=run_id,
            data={"action": "prepared", "status": "pending", "rows": n_rows},
        )
    return True


def _fail(factory: sessionmaker[Session], run_id: uuid.UUID, reason: str) -> bool:
    with transaction(factory) as session:
        if not lifecycle.move(session, run_id, "prepare_failed", reason[:2000]):
            return False
        repository.delete_rows(session, run_id)
        raise_event(
            session,
            kind="run.status",
            severity="critical",
            message=f"the run failed while preparing its prompt rows: {reason}"[:2000],
            run_id=run_id,
            data={"action": "prepare_failed", "status": "failed"},
        )
    return True


def _prepared_message(n_rows: int | None, epochs: int) -> str:
    if n_rows is None:
        return "prepared: the eval rows are stored; the run is pending"
    return f"prepared: {n_rows:,} dataset rows × {epochs} epoch(s); the run is pending"
