"""Dataset rules: reads, deletion, the dataset a run names (checked at run creation: it is of
the run's project, `dataset_for_run`, the one home of that rule), and the one reader of a stored
dataset's rows with a run's column mapping (iter_mapped_rows)."""

from __future__ import annotations

import hashlib
import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from protocol import datasets, layout, run_config
from protocol.error_codes import ErrorCode
from protocol.run_config import HfDataset, RunConfig, StoredDataset, check_prompt_rows
from protocol.storage import ObjectStore
from server.datasets import files, repository
from server.datasets.schemas import DatasetOut
from server.errors import Conflict, NotFound, Unprocessable
from server.models import Dataset
from server.models.project import DEFAULT_PROJECT_ID

Prompt = datasets.Prompt


def get(session: Session, dataset_id: uuid.UUID) -> Dataset:
    dataset = repository.get(session, dataset_id)
    if dataset is None:
        raise NotFound(f"dataset {dataset_id} not found", code=ErrorCode.dataset_not_found)
    return dataset


def list_datasets(
    session: Session, limit: int, offset: int, project_id: uuid.UUID | None = None
) -> list[DatasetOut]:
    """Datasets, newest first; of one project when given (None: every project's)."""
    found = repository.list_datasets(session, limit, offset, project_id)
    return [DatasetOut.model_validate(d) for d in found]


def delete(session: Session, store: ObjectStore, dataset_id: uuid.UUID) -> None:
    """Delete a dataset no run uses (409 naming the runs otherwise), then its object."""
    dataset = get(session, dataset_id)
    runs = repository.runs_using(session, dataset_id)
    if runs:
        names = ", ".join(str(r) for r in runs[:5])
        raise Conflict(
            f"dataset {dataset_id} is used by {len(runs)} run(s): {names}",
            code=ErrorCode.dataset_in_use,
        )
    try:
        with session.begin_nested():
            repository.remove(session, dataset_id)
    except IntegrityError:  # a run created on it committed after the check above
        raise Conflict(
            f"dataset {dataset_id} is used by a run created just now", code=ErrorCode.dataset_in_use
        ) from None
    session.commit()
    store.delete(dataset.bucket_key)


# -- the dataset of a run ----------------------------------------------------------------------


def spec_key(spec: HfDataset, project_id: uuid.UUID = DEFAULT_PROJECT_ID) -> str:
    """The find-or-create key of an hf spec in a project: one loaded copy per project, as every
    dataset is one project's (docs/guides/projects.md). The default project's key is the
    spec's alone, as before projects, so the rows loaded before revision 0014 are found."""
    keyed: dict[str, Any] = spec.spec()
    if project_id != DEFAULT_PROJECT_ID:
        keyed = {"project_id": str(project_id), "spec": keyed}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()


def find_or_create_hf(
    session: Session, spec: HfDataset, project_id: uuid.UUID = DEFAULT_PROJECT_ID
) -> Dataset:
    """The one row of this hf spec in the project: created pending (the `datasets` job loads
    it), or put back to pending when it failed before (the Hub may be reachable now). Two run
    creations naming a new spec at once both try the insert: the loser's savepoint is rolled
    back and it takes the winner's row (the unique spec_key), not a 500."""
    key = spec_key(spec, project_id)
    found = repository.by_spec_key(session, key)
    if found is None:
        try:
            with session.begin_nested():
                return _insert_hf(session, spec, key, project_id)
        except IntegrityError:
            found = repository.by_spec_key(session, key)
            if found is None:
                raise
    repository.retry(session, found.id)
    return repository.get(session, found.id) or found


def _insert_hf(session: Session, spec: HfDataset, key: str, project_id: uuid.UUID) -> Dataset:
    dataset_id = uuid.uuid4()
    name = f"{spec.path}" + (f" ({spec.name})" if spec.name else "") + f" [{spec.split}]"
    return repository.insert(
        session,
        id=dataset_id,
        name=name[:200],
        kind="hf",
        status="pending",
        format="parquet",
        bucket_key=layout.dataset_key(dataset_id, "parquet"),
        spec=spec.spec(),
        spec_key=key,
        project_id=project_id,
    )


def dataset_for_run(
    session: Session,
    spec: StoredDataset,
    epochs: int,
    where: str = "dataset",
    project_id: uuid.UUID = DEFAULT_PROJECT_ID,
) -> Dataset:
    """The dataset a new run of `project_id` reads, checked as far as it is known: 422 naming
    the field for an unknown or failed dataset, one of another project, a missing column (with
    the columns that exist) or too many prompt rows. A pending one is accepted (its columns
    checked when known, as for an upload): the run waits for it (status `preparing`). `where`
    is the config path of the spec (e.g. `eval.dataset`), named in the errors."""
    if isinstance(spec, HfDataset):
        dataset_id = find_or_create_hf(session, spec, project_id).id
    else:
        dataset_id = spec.id
    # Locked until the run is committed: a concurrent delete waits (then sees the run), or is
    # waited for (then the dataset is not found), instead of a foreign-key error.
    found = repository.get_for_share(session, dataset_id)
    if found is None:
        raise Unprocessable(
            f"dataset {dataset_id} not found", field=f"{where}.id", code=ErrorCode.unknown_dataset
        )
    dataset = found
    if dataset.project_id != project_id:
        raise Unprocessable(
            f"dataset {dataset.id} is in project {dataset.project.name!r}, not the run's: "
            "upload it to the run's project (asyncgrpo datasets upload --project)",
            field=f"{where}.id",
            code=ErrorCode.dataset_of_another_project,
        )
    if dataset.status == "failed":
        raise Unprocessable(
            f"dataset {dataset.id} failed: {dataset.reason}",
            field=f"{where}.id",
            code=ErrorCode.dataset_failed,
        )
    # An upload's columns and rows are known from the moment it is stored (the request read
    # them), even while the job still checks it.
    if dataset.columns is not None:
        check_columns(dataset, spec, where)
    if dataset.row_count is not None:
        try:
            check_prompt_rows(epochs, int(dataset.row_count))
        except ValueError as exc:
            raise Unprocessable(str(exc), field="epochs", code=ErrorCode.invalid_value) from None
    return dataset


def missing_column(
    dataset: Dataset, spec: StoredDataset, where: str = "dataset"
) -> tuple[str, str] | None:
    """(field, message) for the first column the mapping names that the dataset lacks."""
    have = list(dataset.columns or [])
    fields = [(f"{where}.prompt_column", spec.prompt_column)] + [
        (f"{where}.reference_columns", c) for c in spec.reference_columns or []
    ]
    for field, column in fields:
        if column not in have:
            return field, (
                f"dataset {dataset.id} has no column {column!r}; its columns: {', '.join(have)}"
            )
    return None


def missing_reward_column(
    config: RunConfig, dataset: Dataset, spec: StoredDataset, where: str
) -> str | None:
    """Why one of the run's rewards cannot work on this stored dataset: a reference column it
    reads that the mapping does not give (None when fine or the columns are not known yet)."""
    if dataset.columns is None:
        return None
    have = spec.known_reference_columns()
    if have is None:
        have = set(dataset.columns) - {spec.prompt_column}
    return run_config.missing_reward_column(config.rewards, have, where)


def check_columns(dataset: Dataset, spec: StoredDataset, where: str = "dataset") -> None:
    missing = missing_column(dataset, spec, where)
    if missing is not None:
        raise Unprocessable(missing[1], field=missing[0], code=ErrorCode.invalid_value)


# -- rows with a column mapping ------------------------------------------------------------------


def map_row(row: dict[str, Any], index: int, spec: StoredDataset) -> tuple[Prompt, dict[str, Any]]:
    """(prompt, reference) of one stored row under the run's mapping; DatasetError naming the
    row when its prompt is missing or not a prompt."""
    if spec.prompt_column not in row:
        raise datasets.DatasetError(
            f"row {index}: no column {spec.prompt_column!r}; its columns: {', '.join(row)}"
        )
    try:
        prompt = datasets.check_prompt(row[spec.prompt_column])
    except datasets.DatasetError as exc:
        raise datasets.DatasetError(f"row {index}: column {spec.prompt_column!r}: {exc}") from None
    if isinstance(prompt, str) and spec.system_prompt:
        prompt = [
            {"role": "system", "content": spec.system_prompt},
            {"role": "user", "content": prompt},
        ]
    names = spec.reference_columns
    if names is None:
        reference = {k: v for k, v in row.items() if k != spec.prompt_column}
    else:
        reference = {k: row.get(k) for k in names}
    return prompt, reference


def iter_mapped_rows(
    store: ObjectStore,
    dataset: Dataset,
    spec: StoredDataset,
    *,
    max_row_bytes: int = 1024 * 1024,
) -> Iterator[tuple[Prompt, dict[str, Any]]]:
    """Every row of a ready stored dataset as (prompt, reference) under `spec`'s column mapping
    (prompt column, system prompt, reference columns), in file order, with bounded memory: the
    object is downloaded to a temp file and read in record batches (Parquet) or lines (JSONL).
    Raises DatasetError naming the row for a row that cannot be used."""
    if dataset.status != "ready":
        raise datasets.DatasetError(f"dataset {dataset.id} is {dataset.status}, not ready")
    missing = missing_column(dataset, spec)
    if missing is not None:
        raise datasets.DatasetError(missing[1])
    with tempfile.TemporaryDirectory(prefix="asyncgrpo-rows-") as folder:
        path = Path(folder) / f"data.{dataset.format}"
        store.download_file(dataset.bucket_key, path)
        # With named reference columns, a Parquet file's other columns are never read.
        columns = spec.columns_needed() if spec.reference_columns is not None else None
        rows = files.iter_rows(path, dataset.format, max_row_bytes, columns)
        for index, row in enumerate(rows):
            yield map_row(row, index, spec)
