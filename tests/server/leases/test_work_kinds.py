"""The work ledger's kinds (docs/architecture/lease-engine.md, "The work ledger"): the engine asks a
lease's kind and never tests it; the grant order and the abort reasons are the kinds' own."""

from __future__ import annotations

import ast
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import ColumnElement, case, literal, null, select, update
from sqlalchemy.orm import Session

from protocol.run_config import RunConfig
from server.evals.ledger import EVAL
from server.evals.service import EVAL_TURN
from server.leases import ledger
from server.leases.train import TRAIN
from server.models import Lease, PromptRow, Run
from tests.harness.runs import run_config
from tests.server.leases.helpers import acquire_lease, bearer, make_run, make_worker

ROOT = Path(__file__).resolve().parents[3]
KIND_HOMES = {ROOT / "server" / "evals"}  # the eval kind's own feature


def _config(**overrides: object) -> RunConfig:
    kinds = {"name": "kinds", "base_model": "m", "dataset": {"kind": "generator", "size": 4}}
    return RunConfig.model_validate(
        run_config(kinds, group_size=8, prompts_per_step=8, **overrides)
    )


def _with_eval() -> RunConfig:
    return _config(
        eval={"dataset": {"kind": "generator", "size": 2}, "accuracy_reward": "numeric_match"}
    )


def test_both_kinds_are_registered_by_the_composition_root() -> None:
    assert ledger.kind_of("train") is TRAIN and ledger.kind_of("eval") is EVAL
    with pytest.raises(LookupError, match="no work kind 'other'"):
        ledger.kind_of("other")


def test_grant_order_is_the_kinds_rule() -> None:
    plain, evaluated = _config(), _with_eval()
    assert ledger.grant_order(plain, "running", 0) == [TRAIN]
    assert ledger.grant_order(plain, "evaluating", 0) == []
    turns = {seq: ledger.grant_order(evaluated, "running", seq) for seq in range(2 * EVAL_TURN)}
    eval_first = [seq for seq, order in turns.items() if order == [EVAL, TRAIN]]
    assert len(eval_first) == 2 and all(
        order in ([TRAIN, EVAL], [EVAL, TRAIN]) for order in turns.values()
    )
    assert ledger.grant_order(evaluated, "evaluating", 1) == [EVAL]
    assert ledger.grant_order(evaluated, "paused", 1) == []


@pytest.mark.parametrize(
    ("kind", "status", "current", "version", "admission", "reason"),
    [
        ("train", "running", 5, 5, True, None),
        ("train", "running", 9, 5, True, "stale"),  # max_staleness 2
        ("train", "running", 9, 5, False, None),  # admission control off: no abort
        ("train", "paused", 5, 5, True, "run_paused"),
        ("train", "evaluating", 5, 5, True, "run_evaluating"),
        ("eval", "running", 9, 1, True, None),  # pinned to its version: never stale
        ("eval", "evaluating", 9, 1, True, None),
        ("eval", "cancelled", 9, 1, True, "run_cancelled"),
    ],
)
def test_abort_reasons_by_kind(
    any_session: Session,
    kind: str,
    status: str,
    current: int,
    version: int,
    admission: bool,
    reason: str | None,
) -> None:
    expression = ledger.kind_of(kind).abort_reason(
        literal(status), literal(current), literal(version), literal(admission), literal(2)
    )
    assert any_session.execute(select(expression)).scalar() == reason


def test_no_module_outside_the_eval_kind_tests_for_it() -> None:
    """`kind == "eval"` lives in the eval kind's feature only; everyone else asks the kind."""
    offenders = []
    for path in sorted((ROOT / "server").rglob("*.py")):
        if any(home in path.parents for home in KIND_HOMES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Constant) and side.value == "eval"
                for side in (node.left, *node.comparators)
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


LEDGER = ROOT / "server" / "leases" / "ledger.py"
KIND_HOLDERS = {"Lease", "RolloutBatch", "lease", "batch", "row"}  # what carries a work kind


def _kind_tests(tree: ast.AST) -> list[int]:
    """Lines comparing a lease's or batch's `kind` (`x.kind == …`, `… != x.kind`, `in`)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(
            isinstance(side, ast.Attribute)
            and side.attr == "kind"
            and isinstance(side.value, ast.Name)
            and side.value.id in KIND_HOLDERS
            for side in (node.left, *node.comparators)
        )
    ]


def test_every_kind_test_goes_through_the_ledger() -> None:
    """Outside the ledger, a lease's or batch's kind is asked of the ledger's policy
    (`of_kind`, `trained`, `is_of`, `kind_of`), never compared."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "server").rglob("*.py"))
        if path != LEDGER
        for line in _kind_tests(ast.parse(path.read_text()))
    ]
    assert offenders == []
    spelled = "if batch.kind != EVAL.name:\n    pass\nq = Lease.kind == 'train'\n"
    assert _kind_tests(ast.parse(spelled)) == [1, 3]  # the check sees both spellings


def test_the_kind_tests_are_the_kinds_rules() -> None:
    assert ledger.is_of("eval", EVAL) and not ledger.is_of("train", EVAL)
    assert not ledger.is_of("other", EVAL)  # an unknown stored kind is no kind
    with pytest.raises(LookupError):
        ledger.of_kind(Lease.kind, "evals")  # a misspelt kind is an error
    kind_test = ledger.of_kind(Lease.kind, EVAL).compile(compile_kwargs={"literal_binds": True})
    assert str(kind_test) == "leases.kind = 'eval'"
    trained = ledger.trained(Lease.kind).compile(compile_kwargs={"literal_binds": True})
    assert str(trained) == "leases.kind IN ('train')"


class _LateKind:
    """A kind registered after the first heartbeat: training's rules but its own abort reason."""

    name = "late"

    def __getattr__(self, rule: str) -> Any:
        return getattr(TRAIN, rule)

    def abort_reason(
        self, run_status: Any, current: Any, version: Any, admission: Any, max_staleness: Any
    ) -> ColumnElement[Any]:
        return case((run_status != "running", "late_" + run_status), else_=null())


def _beat(client: TestClient, token: str, lease: dict[str, Any]) -> dict[str, Any]:
    answer = client.post(
        f"/api/v1/leases/{lease['lease_id']}/heartbeat",
        json={"fencing": lease["fencing"]},
        headers=bearer(token),
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


@pytest.mark.timeout(60)
def test_a_kind_registered_after_the_first_heartbeat_is_aborted_by_its_rule(
    lease_client: TestClient, db: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(db, n_rows=4)
    _, token = make_worker(db)
    db.commit()
    lease = acquire_lease(lease_client, token)
    assert _beat(lease_client, token, lease)["abort"] is False  # the heartbeat's unit is built
    monkeypatch.setattr(ledger, "KINDS", dict(ledger.KINDS))  # the test's registration undone
    ledger.register(_LateKind())  # type: ignore[arg-type]
    lease_id = uuid.UUID(lease["lease_id"])
    db.execute(update(Lease).where(Lease.id == lease_id).values(kind="late"))
    db.execute(update(Run).where(Run.id == run.id).values(status="paused"))
    db.commit()
    answer = _beat(lease_client, token, lease)
    assert answer["abort"] is True and answer["reason"] == "late_paused"
    db.expire_all()
    assert db.get(Lease, lease_id).state == "aborted"  # type: ignore[union-attr]
    rows = db.execute(
        select(PromptRow.state).where(
            PromptRow.id.in_([p["prompt_row_id"] for p in lease["prompts"]])
        )
    ).scalars()
    assert set(rows) == {"queued"}  # back by the kind's own requeue
    db.commit()
