"""The fleet's project rule, its one home (docs/architecture/contract.md, invariant 28;
docs/architecture/lease-engine.md, "Projects"): a worker or pool learner registered with a
project's registration token serves only that project's runs; one with no project (a shared
token's: the shared fleet) serves every project. One rule in two forms: SQL, for the grant's
candidate runs, the fair share's contenders and a pool learner's take, and Python, for the
version feed, which filters the runs its watch holds in memory."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import ColumnElement, or_


def serves(fleet_project: Any, run_project: Any) -> ColumnElement[bool]:
    """SQL: the worker or pool learner whose project is `fleet_project` (a column or a
    parameter; NULL: the shared fleet) serves a run of `run_project`."""
    return or_(fleet_project.is_(None), fleet_project == run_project)


def serves_project(fleet_project: uuid.UUID | None, run_project: uuid.UUID) -> bool:
    """`serves`, for values in memory."""
    return fleet_project is None or fleet_project == run_project
