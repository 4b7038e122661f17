"""The work ledger's kinds by name (server/leases/kinds.py), and the grant order they make."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, bindparam, case

from protocol.run_config import RunConfig
from server.evals.ledger import EVAL
from server.leases.kinds import WorkKind
from server.leases.train import TRAIN
from server.models import Lease, Run

KINDS: dict[str, WorkKind] = {kind.name: kind for kind in (TRAIN, EVAL)}


def kind_of(name: str) -> WorkKind:
    return KINDS[name]


def grant_order(config: RunConfig, run_status: str, fencing_seq: int) -> list[WorkKind]:
    """The kinds a grant of this run tries, in turn: those the run offers, a kind whose turn it
    is (eval's every EVAL_TURN-th grant) first, then in ledger order."""
    offered = [kind for kind in KINDS.values() if kind.offered(config, run_status)]
    return sorted(offered, key=lambda kind: not kind.goes_first(fencing_seq))


def abort_reason() -> ColumnElement[Any]:
    """Why a heartbeat aborts a held lease, by its kind (NULL: it does not), over the lease and
    run columns and the run's `admission` and `max_staleness` bound as parameters."""
    admission: Any = bindparam("admission")
    max_staleness: Any = bindparam("max_staleness")
    return case(
        *(
            (
                Lease.kind == name,
                kind.abort_reason(
                    Run.status, Run.current_version, Lease.adapter_version, admission, max_staleness
                ),
            )
            for name, kind in KINDS.items()
        )
    )
