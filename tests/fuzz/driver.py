"""Runs one check function over every operation of a schemathesis schema, one pytest subtest per
operation, with schemathesis' own phases (explicit examples, coverage, fuzzing).

This is what `schemathesis.pytest.from_fixture(...).parametrize()` does; that wrapper cannot be
used here because it rewrites `request.node._nodeid`, which pytest 9.2 no longer has. The
per-operation tests come from the same builder (`get_all_tests`), so generation, seeds and
phases are schemathesis' own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from schemathesis.checks import load_all_checks
from schemathesis.core.failures import FailureGroup, as_reported_failure
from schemathesis.core.result import Ok
from schemathesis.pytest.lazy import get_all_tests


def hypothesis_settings() -> settings:
    """Deterministic and bounded: no example database, derandomized, no deadline (Postgres
    latency on a shared 2-core box is not what this test is about)."""
    return settings(
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )


def run_operations(schema: Any, check: Callable[[Any], None], subtests: Any) -> list[str]:
    """Run `check(case)` over the cases schemathesis generates for each operation; failures
    are reported per operation through `subtests`. Returns the labels of operations run."""
    load_all_checks()
    labels: list[str] = []
    bound = schema.clone(test_function=check)
    for result in get_all_tests(
        schema=bound, test_func=check, settings=hypothesis_settings(), given_kwargs={}
    ):
        if not isinstance(result, Ok):
            with subtests.test(msg="schema"):
                raise result.err()
            continue
        operation, test = result.ok()
        labels.append(operation.label)
        with subtests.test(msg=operation.label):
            try:
                test()
            except FailureGroup as exc:
                raise as_reported_failure(exc) from None
    if not labels:
        pytest.fail("the schema has no operations")
    return labels
