"""The runs tests' app on Postgres and SQLite (tests/server/runs/conftest.py), for projects."""

from __future__ import annotations

from tests.server.runs.conftest import admin, db, runs_app, runs_client

__all__ = ["admin", "db", "runs_app", "runs_client"]
