"""Row-level checks of a decoded format 2 (trajectory) batch table: vectorised where cheap
(nulls, vocabulary, log-prob values, groups), then `validate_trajectory` on every row, the
per-turn and turn-count limits of the run's environment, and the prompt spans."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from protocol.batch_validate import RowError, check_groups
from protocol.trajectories import Trajectory, TrajectoryError, validate_trajectory

if TYPE_CHECKING:
    from protocol.batch_reader import BatchExpectations, TrajectoryRecord

_LISTS = ("token_ids", "loss_mask", "spans")


def _column(table: pa.Table, name: str) -> pa.Array:
    return table.column(name).combine_chunks()


def _check_nulls(table: pa.Table, kind: str) -> None:
    for name in table.column_names:
        col = _column(table, name)
        if name == "behaviour_logprobs":
            if kind == "eval" and col.null_count != len(col):
                raise RowError("eval_logprobs", "an eval batch carries no behaviour log-probs")
            if kind != "eval" and col.null_count:
                raise RowError("nulls", f"column {name} has {col.null_count} null rows")
            continue
        if col.null_count:
            raise RowError("nulls", f"column {name} has {col.null_count} nulls")
        if name in _LISTS:
            items = pc.list_flatten(col)
            if items.null_count:
                raise RowError("nulls", f"column {name} has null list elements")
            if name == "spans":
                for child in ("kind", "start", "end"):
                    if pc.struct_field(items, child).null_count:
                        raise RowError("nulls", f"spans.{child} has nulls")


def _check_values(table: pa.Table, expect: BatchExpectations, eps: float) -> None:
    ids = pc.list_flatten(_column(table, "token_ids")).to_numpy()
    if ids.size and (ids.min() < 0 or ids.max() >= expect.vocab_size):
        raise RowError(
            "token_out_of_vocab",
            f"token_ids: ids {ids.min()}..{ids.max()} outside [0, {expect.vocab_size})",
        )
    if expect.kind == "eval":
        return
    lp = pc.drop_null(pc.list_flatten(_column(table, "behaviour_logprobs"))).to_numpy()
    if not np.isfinite(lp).all():
        raise RowError("logprob_not_finite", "a behaviour log-prob is NaN or infinite")
    if lp.size and lp.max() > eps:
        raise RowError("logprob_positive", f"a behaviour log-prob is {lp.max()} > 0")


def _json(text: str, what: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RowError(what, f"{where}: {what} is not JSON: {exc}") from exc


def _trajectory(cols: dict[str, list[Any]], i: int, where: str) -> Trajectory:
    messages = _json(cols["transcript"][i], "transcript", where)
    info = _json(cols["info"][i], "info", where)
    if not isinstance(info, dict):
        raise RowError("info", f"{where}: info must be a JSON object")
    logprobs = cols["behaviour_logprobs"][i]
    n = len(cols["token_ids"][i])
    try:
        return Trajectory(
            token_ids=cols["token_ids"][i],
            loss_mask=cols["loss_mask"][i],
            # tolerated rounding above 0 (as format 1) becomes 0
            logprobs=[None] * n
            if logprobs is None
            else [None if x is None else min(x, 0.0) for x in logprobs],
            spans=cols["spans"][i],
            messages=messages,
            stop_reason=cols["stop_reason"][i],
            tool_calls=cols["tool_calls"][i],
            tool_errors=cols["tool_errors"][i],
            info=info,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise RowError("trajectory", f"{where}: {loc}: {first['msg']}") from exc


def _check_turns(t: Trajectory, expect: BatchExpectations, where: str) -> None:
    for span in t.spans:
        if span.kind == "model" and span.end - span.start > expect.max_new_tokens:
            raise RowError(
                "turn_too_long",
                f"{where}: a model turn of {span.end - span.start} tokens > max_new_tokens "
                f"{expect.max_new_tokens}",
            )
    env = expect.environment
    if env is not None and t.model_turns > env.turns:
        raise RowError(
            "max_turns", f"{where}: {t.model_turns} model turns > the run's max_turns {env.turns}"
        )


def _check_prompts(records: list[TrajectoryRecord], expect: BatchExpectations) -> None:
    g = expect.group_size
    for start in range(0, len(records), g):
        first = records[start].prompt_token_ids
        row_id = records[start].prompt_row_id
        if any(r.prompt_token_ids != first for r in records[start + 1 : start + g]):
            raise RowError(
                "group_prompt",
                f"prompt row {row_id}: trajectories disagree on the prompt",
                "prompt_mismatch",
            )
        if expect.prompt_token_ids is not None:
            want = expect.prompt_token_ids.get(row_id)
            if want is None or list(want) != first:
                raise RowError(
                    "prompt_tokens",
                    f"prompt row {row_id}: prompt token ids differ",
                    "prompt_mismatch",
                )


def check_trajectory_rows(
    table: pa.Table, expect: BatchExpectations, eps: float
) -> list[TrajectoryRecord]:
    """Raise RowError on the first failed check; the rows as records in canonical order."""
    from protocol.batch_reader import TrajectoryRecord, max_trajectory_tokens

    _check_nulls(table, expect.kind)
    _check_values(table, expect, eps)
    order = check_groups(table, expect)
    taken = pa.array(order)
    cols = {name: _column(table, name).take(taken).to_pylist() for name in table.column_names}
    limit = max_trajectory_tokens(expect)
    records = []
    for i in range(len(order)):
        where = f"prompt row {cols['prompt_row_id'][i]} group {cols['group_index'][i]}"
        t = _trajectory(cols, i, where)
        try:
            validate_trajectory(t, limit, scored_only=expect.kind == "eval")
        except TrajectoryError as exc:
            raise RowError("trajectory", f"{where}: {exc}") from exc
        _check_turns(t, expect, where)
        records.append(
            TrajectoryRecord(
                prompt_row_id=cols["prompt_row_id"][i],
                group_index=cols["group_index"][i],
                token_ids=t.token_ids,
                loss_mask=t.loss_mask,
                logprobs=t.logprobs,
                spans=t.spans,
                messages=t.messages,
                stop_reason=t.stop_reason,
                tool_calls=t.tool_calls,
                tool_errors=t.tool_errors,
                info=t.info,
            )
        )
    _check_prompts(records, expect)
    return records
