"""A doctor's checks: each one line, PASS, FAIL or SKIP with its detail and, on a failure, the
fix; a check whose needed checks did not pass is skipped, naming them. The exit code is 1 when
any check failed."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from rich.console import Console
from rich.text import Text

Status = Literal["PASS", "FAIL", "SKIP"]
STYLES = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}


@dataclass(frozen=True)
class Result:
    name: str
    status: Status
    detail: str
    fix: str | None = None


def passed(detail: str) -> tuple[Status, str, None]:
    return "PASS", detail, None


def failed(detail: str, fix: str) -> tuple[Status, str, str]:
    return "FAIL", detail, fix


def skipped(detail: str) -> tuple[Status, str, None]:
    return "SKIP", detail, None


Outcome = tuple[Status, str, str | None]


@dataclass(frozen=True)
class Check:
    """One check: `run` answers its outcome; `needs` names the checks it builds on."""

    name: str
    run: Callable[[], Outcome]
    needs: tuple[str, ...] = ()


def run_checks(checks: Sequence[Check]) -> list[Result]:
    """Every check in order; one whose needs did not pass is skipped. An exception a check did
    not expect is its failure, with the exception's words (never a traceback)."""
    results: dict[str, Result] = {}
    for check in checks:
        missing = [n for n in check.needs if results[n].status != "PASS"]
        if missing:
            why = ", ".join(f"{n} ({results[n].status.lower()})" for n in missing)
            results[check.name] = Result(check.name, "SKIP", f"needs {why}")
            continue
        try:
            status, detail, fix = check.run()
        except Exception as exc:  # noqa: BLE001 - one line for the user, whatever it is
            status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
            fix = "a failure this check did not expect: the detail says what failed"
        results[check.name] = Result(check.name, status, detail, fix)
    return list(results.values())


def exit_code(results: Sequence[Result]) -> int:
    return 1 if any(r.status == "FAIL" for r in results) else 0


def line(result: Result) -> Text:
    """`PASS name: detail`, with ` — fix: …` on a failure; no markup is read from the text."""
    text = Text()
    text.append(result.status, style=STYLES[result.status])
    text.append(f" {result.name}: {result.detail}")
    if result.fix:
        text.append(f" — fix: {result.fix}")
    return text


def report(results: Sequence[Result], role: str, *, as_json: bool, console: Console) -> None:
    if as_json:
        document = {
            "ok": exit_code(results) == 0,
            "role": role,
            "checks": [asdict(r) for r in results],
        }
        console.file.write(json.dumps(document, indent=2) + "\n")
        return
    for result in results:
        console.print(line(result), soft_wrap=True, highlight=False)
