"""End-to-end fixtures: a real cluster (tests/harness/fixtures.py `e2e`: uvicorn server on a
fresh Postgres database with the jobs in-process, moto S3 behind a TCP proxy that a test can
cut, the learner and workers as subprocesses with the small model, one torch thread each)."""

from tests.harness.fixtures import e2e

__all__ = ["e2e"]
