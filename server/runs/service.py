"""Run rules: creation (for the generator and inline kinds, the dataset rows and every epoch's
prompt rows up front; a run on a stored dataset, or with a stored eval dataset, is created
`preparing` and the run_prep job makes them: server/runs/prepare.py), the learner token, the
config and live stats. Status changes: server/runs/lifecycle.py."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, object_session

from protocol import datasets
from protocol.error_codes import ErrorCode
from protocol.outbound import OutboundPolicy, normalised_url, redacted_url
from protocol.run_config import (
    GeneratorDataset,
    HfDataset,
    InlineDataset,
    RunConfig,
    StoredDataset,
    UploadedDataset,
)
from protocol.schemas import TERMINAL_RUN_STATUSES
from server.datasets import service as datasets_service
from server.errors import NotFound, Unprocessable
from server.models import Dataset, Run
from server.models.project import DEFAULT_PROJECT_ID
from server.runs import repository
from server.runs.schemas import RunDetail, RunOut, RunStats, SpendOut
from server.runs.serving import serving_problem
from server.tokens import service as tokens

# Eval rows are stored by the evals feature (server/evals/service.py insert_eval_rows), above
# runs in the feature order: the composition root hands the writer in (server/wiring.py).
# The writer's last argument: replace the rows already stored (a preparation starting again).
EvalRowWriter = Callable[[Session, uuid.UUID, Iterable[tuple[Any, dict[str, Any]]], bool], int]
_eval_row_writer: list[EvalRowWriter] = []


def store_eval_rows_with(writer: EvalRowWriter) -> None:
    _eval_row_writer[:] = [writer]


def store_eval_rows(
    session: Session,
    run_id: uuid.UUID,
    rows: Iterable[tuple[Any, dict[str, Any]]],
    *,
    replace: bool = False,
) -> int:
    """The run's eval rows stored (at most eval.max_prompts in all; with `replace`, instead of
    any already stored); how many were."""
    if not _eval_row_writer:
        raise RuntimeError("no eval row writer: call server.wiring.wire() at start")
    return _eval_row_writer[0](session, run_id, rows, replace)


# -- creation and config ------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepTag:
    """What a sweep's run stores of its sweep: the sweep, its combination's index and the
    overrides ({field path: value}) that made its config."""

    sweep_id: uuid.UUID
    index: int
    overrides: dict[str, Any]

    def columns(self) -> dict[str, Any]:
        return {"sweep_id": self.sweep_id, "sweep_index": self.index, "overrides": self.overrides}


def dataset_rows(ds: GeneratorDataset | InlineDataset) -> Iterator[tuple[Any, dict[str, Any]]]:
    """(prompt, reference) pairs of a generator or inline dataset (training or eval)."""
    rows = (
        datasets.generate(ds.generator, ds.size, ds.seed)
        if isinstance(ds, GeneratorDataset)
        else ds.rows
    )
    for row in rows:
        record = datasets.split_row(row)
        yield record.prompt, record.reference


def with_checked_webhook(config: RunConfig, policy: OutboundPolicy) -> RunConfig:
    """The config with its webhook URL as the delivery client will send it (normalised_url),
    or 422 at `alarms.webhook_url`: a URL the client cannot use (webhook_url_invalid) or an IP
    literal the outbound policy does not allow (webhook_url_refused; a host name is checked
    when a delivery resolves it)."""
    url = config.alarms.webhook_url
    if url is None:
        return config
    try:
        normal = normalised_url(url)
    except ValueError as exc:
        raise Unprocessable(
            f"alarms.webhook_url {exc} (got {redacted_url(url)!r})",
            field="alarms.webhook_url",
            code="webhook_url_invalid",
        ) from None
    reason = policy.literal_refusal(normal)
    if reason:
        raise Unprocessable(
            f"the webhook URL's host is refused: {reason}",
            field="alarms.webhook_url",
            code="webhook_url_refused",
        )
    alarms = config.alarms.model_copy(update={"webhook_url": normal})
    return config.model_copy(update={"alarms": alarms})


def check_judge_urls(config: RunConfig, policy: OutboundPolicy) -> None:
    """422 when an `llm_judge` reward's base_url is a URL the client cannot use
    (normalised_url) or an IP literal the outbound policy refuses (a host name is checked when
    the learner's call resolves it, with the learner host's policy)."""
    for i, spec in enumerate(config.rewards):
        url = spec.kwargs.get("base_url") if spec.name == "llm_judge" else None
        if not isinstance(url, str):
            continue
        field = f"rewards.{i}.kwargs.base_url"
        try:
            normalised_url(url)
        except ValueError as exc:
            raise Unprocessable(
                f"the judge's base_url {exc}", field=field, code=ErrorCode.judge_url_invalid
            ) from None
        reason = policy.literal_refusal(url)
        if reason:
            raise Unprocessable(
                f"the judge's host is refused: {reason}",
                field=field,
                code=ErrorCode.judge_url_refused,
            )


def create_run(
    session: Session,
    config: RunConfig,
    *,
    sweep: SweepTag | None = None,
    project_id: uuid.UUID = DEFAULT_PROJECT_ID,
    created_by: uuid.UUID | None = None,
) -> tuple[Run, str]:
    """Insert the run and mint its learner token (shown once); a sweep's run carries its tag
    (server/sweeps/service.py). Generator and inline kinds:
    the run is pending with its dataset rows and every epoch's prompt rows (queued, queue_pos =
    epoch × N + row_index) inserted in bulk here. Stored kinds (uploaded, hf): the dataset is
    checked as far as it is known (422 otherwise) and the run is `preparing` until the run_prep
    job has made its rows."""
    ds = config.dataset
    dataset_id = eval_dataset_id = None
    if isinstance(ds, UploadedDataset | HfDataset):
        train = datasets_service.dataset_for_run(session, ds, config.epochs, project_id=project_id)
        _check_reward_columns(config, train, ds, "the dataset")
        dataset_id = train.id
    eval_ds = config.eval.dataset if config.eval is not None else None
    if isinstance(eval_ds, UploadedDataset | HfDataset):
        held_out = datasets_service.dataset_for_run(
            session, eval_ds, 0, "eval.dataset", project_id=project_id
        )
        _check_eval_rows(config, held_out.row_count)
        _check_reward_columns(config, held_out, eval_ds, "the eval dataset")
        eval_dataset_id = held_out.id
    stored = dataset_id is not None or eval_dataset_id is not None
    run = repository.insert_run(
        session,
        name=config.name,
        status="preparing" if stored else "pending",
        base_model=config.base_model,
        priority=config.priority,
        config=config.model_dump(mode="json"),
        dataset_id=dataset_id,
        eval_dataset_id=eval_dataset_id,
        project_id=project_id,
        created_by_token_id=created_by,
        **({} if sweep is None else sweep.columns()),
    )
    if isinstance(ds, GeneratorDataset | InlineDataset):
        n_rows = repository.insert_dataset_rows(session, run.id, dataset_rows(ds))
        repository.insert_prompt_rows(session, run.id, n_rows, config.epochs)
    name = f"learner of {config.name}"[:200]
    minted = tokens.mint(session, "learner", name=name, scope_id=run.id)
    with _CACHE_LOCK:
        _LIVE.put(run.id, config)  # a new run is live
    if isinstance(eval_ds, GeneratorDataset | InlineDataset):
        store_eval_rows(session, run.id, dataset_rows(eval_ds))
    return run, minted.plaintext


def _check_reward_columns(
    config: RunConfig, dataset: Dataset, spec: StoredDataset, where: str
) -> None:
    """A reward reading a column the stored dataset lacks: 422 on `rewards` (when the columns
    are known; an hf dataset still loading is checked by run_prep)."""
    why = datasets_service.missing_reward_column(config, dataset, spec, where)
    if why is not None:
        raise Unprocessable(why, field="rewards", code=ErrorCode.invalid_value)


def _check_eval_rows(config: RunConfig, rows: int | None) -> None:
    if config.eval is not None and rows is not None:
        try:
            config.eval.check_stored_rows(rows)
        except ValueError as exc:
            raise Unprocessable(
                str(exc), field="eval.max_prompts", code=ErrorCode.invalid_value
            ) from None


class _Configs:
    """Parsed configs by run id, the oldest dropped past `capacity` (a config never changes
    after creation, so a kept one is never stale)."""

    def __init__(self, capacity: int) -> None:
        self.entries: OrderedDict[uuid.UUID, RunConfig] = OrderedDict()
        self.minimum = self.capacity = capacity

    def put(self, run_id: uuid.UUID, config: RunConfig) -> None:
        self.entries[run_id] = config
        self.entries.move_to_end(run_id)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)


# The lease path's configs (docs/architecture/lease-engine.md, "The lease engine"): live runs'
# only, at least every live run's (counted on a miss), so no read of finished runs' configs (the
# dashboard's runs table lists up to 200 every 2 s) can evict them. Finished runs' configs are
# kept apart, as many as the runs table lists.
_LIVE = _Configs(64)
_ENDED = _Configs(256)
_CACHE_LOCK = threading.Lock()
_LOADING: dict[uuid.UUID, threading.Lock] = {}
_validations = 0  # configs validated by this process (tests and benchmarks read it)


def forget_configs() -> None:
    """Drop every kept config (tests: parse from the database as a fresh process would)."""
    with _CACHE_LOCK:
        for kept in (_LIVE, _ENDED):
            kept.entries.clear()
            kept.capacity = kept.minimum


def config_validations() -> int:
    """How many configs this process has validated since it started (each a cache miss)."""
    with _CACHE_LOCK:
        return _validations


def _kept(run_id: uuid.UUID) -> RunConfig | None:
    """Under _CACHE_LOCK."""
    return _LIVE.entries.get(run_id) or _ENDED.entries.get(run_id)


def _cached(run_id: uuid.UUID) -> RunConfig | None:
    with _CACHE_LOCK:
        return _kept(run_id)


def _parse(
    session: Session | None, run_id: uuid.UUID, raw: dict[str, Any], status: str
) -> RunConfig:
    """Validate a config read from its row and keep it: a live run's with the lease path's,
    sized to the live runs (a sweep of more runs than a fixed size would re-validate every
    config on every lease); a finished run's apart."""
    global _validations
    config = RunConfig.model_validate(raw)
    live = status not in TERMINAL_RUN_STATUSES
    count = repository.live_run_count(session) if live and session is not None else None
    with _CACHE_LOCK:
        _validations += 1
        if count is not None:
            _LIVE.capacity = max(_LIVE.minimum, count)
        (_LIVE if live else _ENDED).put(run_id, config)
    return config


def get_config(run: Run) -> RunConfig:
    """The run's validated config. A run's config never changes after creation, so parsed
    configs are kept per run id (a 1,000-row inline config is not re-validated per lease)."""
    cached = _cached(run.id)
    if cached is not None:
        return cached
    return _parse(object_session(run), run.id, run.config, run.status)


def cached_config(run_id: uuid.UUID) -> RunConfig | None:
    """The run's parsed config if this process has it, without touching the database."""
    return _cached(run_id)


def config_of(session: Session, run_id: uuid.UUID) -> RunConfig:
    """get_config by run id, reading the config column only when it is not cached (the lease
    engine's hot path never loads a large inline dataset). One thread parses a run's config;
    the others wait for it instead of each validating the rows."""
    with _CACHE_LOCK:
        cached = _kept(run_id)
        if cached is not None:
            return cached
        loading = _LOADING.setdefault(run_id, threading.Lock())
    try:
        with loading:
            cached = _cached(run_id)
            if cached is not None:
                return cached
            row = repository.config_and_status(session, run_id)
            if row is None:
                raise NotFound(f"run {run_id} not found", code=ErrorCode.run_not_found)
            return _parse(session, run_id, *row)
    finally:  # a missing run or an invalid config leaves no lock behind
        with _CACHE_LOCK:
            _LOADING.pop(run_id, None)


# -- reads ----------------------------------------------------------------------------------------


def get_run(session: Session, run_id: uuid.UUID) -> Run:
    run = repository.get(session, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found", code=ErrorCode.run_not_found)
    return run


def list_runs(
    session: Session,
    status: str | None,
    limit: int,
    offset: int,
    project_id: uuid.UUID | None = None,
) -> list[RunOut]:
    """Runs, newest first, of one status and one project when given (None: all)."""
    runs = repository.list_runs(session, status, limit, offset, project_id)
    return [RunOut.model_validate(r) for r in runs]


def stats(session: Session, run: Run) -> RunStats:
    config = get_config(run)
    costs = repository.cost_by_kind(session, run.id)
    return RunStats(
        prompt_rows=repository.prompt_rows_by_state(session, run.id),
        dropped=repository.dropped_by_reason(session, run.id),
        batches=repository.batches_by_state(session, run.id),
        rejected=repository.rejected_by_reason(session, run.id),
        active_leases=repository.active_leases(session, run.id),
        current_version=run.current_version,
        groups_in_flight=run.groups_in_flight,
        admission_bound_groups=config.admission_bound_groups(),
        learner_attached=repository.learner_live(session, run.id),
        spend=SpendOut(
            total_usd=run.spent_usd,
            workers_usd=costs.get("worker", 0.0),
            learner_usd=costs.get("learner", 0.0),
            budget_usd=config.budget_usd,
        ),
    )


def shown_config(config: dict[str, Any]) -> dict[str, Any]:
    """A stored config as API answers show it: the webhook URL without its user:password and
    query (protocol/outbound.py redacted_url); deliveries use the stored URL."""
    url = (config.get("alarms") or {}).get("webhook_url")
    if not isinstance(url, str):
        return config
    return {**config, "alarms": {**config["alarms"], "webhook_url": redacted_url(url)}}


def detail(session: Session, run: Run, silent_s: float) -> RunDetail:
    """The run with its config, live stats, and whether its live workers can serve it (a
    worker silent past `silent_s` is not live: settings.jobs.worker_silent_s)."""
    out = RunOut.model_validate(run)
    shown = shown_config(run.config)
    config = get_config(run)
    problem = serving_problem(session, run, config, silent_s)
    return RunDetail(
        **out.model_dump(),
        config=shown,
        stats=stats(session, run),
        serving=problem,
        best_metric=config.best_metric,
    )
