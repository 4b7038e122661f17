"""The doctor's check runner and report (asyncgrpo/doctor/checks.py): a check whose needs did
not pass is skipped naming them, an unexpected exception is that check's failure (one line, no
traceback), a failure's line carries its fix, and the JSON report lists every check."""

from __future__ import annotations

import io
import json

from rich.console import Console

from asyncgrpo.doctor.checks import (
    Check,
    Outcome,
    exit_code,
    failed,
    line,
    passed,
    report,
    run_checks,
    skipped,
)


def _boom() -> Outcome:
    raise KeyError("no such thing")


CHECKS = [
    Check("a", lambda: passed("fine")),
    Check("b", lambda: failed("broken [red]", "mend it")),
    Check("c", lambda: passed("never run"), ("a", "b")),
    Check("d", lambda: skipped("not here")),
    Check("e", lambda: passed("never run"), ("d",)),
    Check("f", _boom, ("a",)),
]


def test_needs_that_did_not_pass_skip_a_check_and_an_exception_fails_it() -> None:
    results = run_checks(CHECKS)
    assert [(r.name, r.status) for r in results] == [
        ("a", "PASS"), ("b", "FAIL"), ("c", "SKIP"), ("d", "SKIP"), ("e", "SKIP"), ("f", "FAIL"),
    ]  # fmt: skip
    by_name = {r.name: r for r in results}
    assert by_name["c"].detail == "needs b (fail)"
    assert by_name["e"].detail == "needs d (skip)"
    assert by_name["f"].detail == "KeyError: 'no such thing'" and by_name["f"].fix
    assert exit_code(results) == 1
    assert exit_code(results[:1]) == 0


def test_a_line_is_status_name_detail_and_the_fix_of_a_failure_unmarked() -> None:
    results = run_checks(CHECKS[:2])
    assert line(results[0]).plain == "PASS a: fine"
    assert line(results[1]).plain == "FAIL b: broken [red] — fix: mend it"  # no markup read
    out = io.StringIO()
    report(results, "worker", as_json=False, console=Console(file=out, width=20))
    assert out.getvalue().splitlines() == ["PASS a: fine", "FAIL b: broken [red] — fix: mend it"]


def test_the_json_report_lists_every_check() -> None:
    results = run_checks(CHECKS)
    out = io.StringIO()
    report(results, "learner", as_json=True, console=Console(file=out))
    document = json.loads(out.getvalue())
    assert document["ok"] is False and document["role"] == "learner"
    assert [c["name"] for c in document["checks"]] == list("abcdef")
    assert document["checks"][1] == {
        "name": "b", "status": "FAIL", "detail": "broken [red]", "fix": "mend it",
    }  # fmt: skip
