"""Row-level checks of a decoded batch table (vectorised; the sizes are already bounded)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from protocol.batch_reader import BatchExpectations, RejectReason

_LIST_COLUMNS = ("prompt_token_ids", "completion_token_ids", "behaviour_logprobs")


class RowError(Exception):
    def __init__(self, check: str, detail: str, reason: RejectReason = "invalid") -> None:
        super().__init__(detail)
        self.reason: RejectReason = reason
        self.check = check
        self.detail = detail


@dataclass(frozen=True)
class CheckedRows:
    order: np.ndarray  # (N,) row indices sorted by (prompt_row_id, group_index)


def _column(table: pa.Table, name: str) -> pa.Array:
    return table.column(name).combine_chunks()


def _check_nulls(table: pa.Table, kind: str) -> None:
    """No nulls anywhere, except that an eval batch's behaviour_logprobs are null in every
    row (eval samples are scored, never trained on)."""
    for name in table.column_names:
        col = _column(table, name)
        if kind == "eval" and name == "behaviour_logprobs":
            if col.null_count != len(col):
                raise RowError("eval_logprobs", "an eval batch carries no behaviour log-probs")
            continue
        if col.null_count:
            raise RowError("nulls", f"column {name} has {col.null_count} nulls")
        if name in _LIST_COLUMNS and pc.list_flatten(col).null_count:
            raise RowError("nulls", f"column {name} has null list elements")


def _check_lengths(table: pa.Table, expect: BatchExpectations) -> None:
    p_len = pc.list_value_length(_column(table, "prompt_token_ids")).to_numpy()
    c_len = pc.list_value_length(_column(table, "completion_token_ids")).to_numpy()
    if (p_len < 1).any() or (p_len > expect.limits.max_prompt_tokens).any():
        raise RowError("prompt_length", f"prompt lengths {p_len.min()}..{p_len.max()} out of range")
    if (c_len < 1).any():
        raise RowError("empty_completion", "a completion has no tokens")
    if (c_len > expect.max_new_tokens).any():
        raise RowError(
            "completion_too_long", f"completion of {c_len.max()} > {expect.max_new_tokens} tokens"
        )
    if expect.kind == "eval":
        return
    l_len = pc.list_value_length(_column(table, "behaviour_logprobs")).to_numpy()
    if (l_len != c_len).any():
        row = int(np.flatnonzero(l_len != c_len)[0])
        raise RowError(
            "logprob_length", f"row {row}: {l_len[row]} log-probs for {c_len[row]} tokens"
        )


def _check_values(table: pa.Table, expect: BatchExpectations, eps: float) -> None:
    for name in ("prompt_token_ids", "completion_token_ids"):
        ids = pc.list_flatten(_column(table, name)).to_numpy()
        if ids.size and (ids.min() < 0 or ids.max() >= expect.vocab_size):
            raise RowError(
                "token_out_of_vocab",
                f"{name}: ids {ids.min()}..{ids.max()} outside [0, {expect.vocab_size})",
            )
    if expect.kind == "eval":
        return
    lp = pc.list_flatten(_column(table, "behaviour_logprobs")).to_numpy()
    if not np.isfinite(lp).all():
        raise RowError("logprob_not_finite", "a behaviour log-prob is NaN or infinite")
    if lp.size and lp.max() > eps:
        raise RowError("logprob_positive", f"a behaviour log-prob is {lp.max()} > 0")


def _check_finish(table: pa.Table, finish_reasons: Sequence[str]) -> None:
    col = _column(table, "finish_reason")
    ok = pc.is_in(col, value_set=pa.array(list(finish_reasons), pa.string()))
    if not pc.all(ok).as_py():
        bad = col.filter(pc.invert(ok))[0].as_py()
        raise RowError("finish_reason", f"finish reason {bad[:40]!r} not in {list(finish_reasons)}")


def check_groups(table: pa.Table, expect: BatchExpectations) -> np.ndarray:
    ids = _column(table, "prompt_row_id").to_numpy()
    gi = _column(table, "group_index").to_numpy()
    wanted = np.array(sorted(set(expect.prompt_row_ids)), dtype=np.int64)
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.shape != wanted.shape or (uniq != wanted).any():
        extra = sorted(set(uniq.tolist()) - set(wanted.tolist()))[:5]
        missing = sorted(set(wanted.tolist()) - set(uniq.tolist()))[:5]
        raise RowError("prompt_rows", f"prompt rows not in the lease {extra}, missing {missing}")
    g = expect.group_size
    if (counts != g).any():
        raise RowError(
            "group_size", f"a prompt row has {counts[counts != g][0]} completions != {g}"
        )
    order = np.lexsort((gi, ids))
    if (gi[order].reshape(len(wanted), g) != np.arange(g)).any():
        raise RowError("group_indices", f"group indices are not 0..{g - 1} for every prompt")
    return order


def _check_prompts(table: pa.Table, expect: BatchExpectations, order: np.ndarray) -> None:
    ids = _column(table, "prompt_row_id").take(pa.array(order)).to_pylist()
    prompts = _column(table, "prompt_token_ids").take(pa.array(order)).to_pylist()
    g = expect.group_size
    for start in range(0, len(ids), g):
        first = prompts[start]
        if any(p != first for p in prompts[start + 1 : start + g]):
            raise RowError(
                "group_prompt",
                f"prompt row {ids[start]}: completions disagree on the prompt",
                "prompt_mismatch",
            )
        if expect.prompt_token_ids is not None:
            want = expect.prompt_token_ids.get(ids[start])
            if want is None or list(want) != first:
                raise RowError(
                    "prompt_tokens",
                    f"prompt row {ids[start]}: prompt token ids differ",
                    "prompt_mismatch",
                )


def check_rows(
    table: pa.Table, expect: BatchExpectations, eps: float, finish_reasons: Sequence[str]
) -> CheckedRows:
    """Raise RowError on the first failed check; return the canonical row order."""
    _check_nulls(table, expect.kind)
    _check_lengths(table, expect)
    _check_values(table, expect, eps)
    _check_finish(table, finish_reasons)
    order = check_groups(table, expect)
    _check_prompts(table, expect, order)
    return CheckedRows(order=order)
