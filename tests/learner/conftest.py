"""Fixtures of the learner tests: the served app (tests/harness/fixtures.py)."""

from tests.harness.fixtures import live, live_s3, proxy

__all__ = ["live", "live_s3", "proxy"]
