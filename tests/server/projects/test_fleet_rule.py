"""The fleet's project rule in its two forms (server/projects/fleet.py, invariant 28): the SQL
expression, on Postgres and SQLite, answers as the Python one does for every case."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Uuid, literal, select
from sqlalchemy.orm import Session

from server.projects.fleet import serves, serves_project

pytestmark = pytest.mark.timeout(60)

A, B = uuid.uuid4(), uuid.uuid4()
CASES = [(None, A, True), (A, A, True), (A, B, False), (B, A, False)]


def test_the_sql_and_the_python_rule_agree(db: Session) -> None:
    for fleet, run, expected in CASES:
        in_sql = db.execute(select(serves(literal(fleet, Uuid), literal(run, Uuid)))).scalar_one()
        assert bool(in_sql) is serves_project(fleet, run) is expected, (fleet, run)
