"""Every benchmark takes --json and then prints one JSON object as its last line."""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

import pytest

from bench import report

BENCH = Path(__file__).resolve().parents[2] / "bench"
# learner_ranks.py is bench/learner.py --ranks, not a benchmark of its own
LIBRARIES = {"common.py", "report.py", "learner_ranks.py"}


def _takes_json(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            called = ast.unparse(node.func)
            if called == "report.add_json_flag":
                return True
            if called.endswith("add_argument") and any(
                isinstance(a, ast.Constant) and a.value == "--json" for a in node.args
            ):
                return True
    return False


@pytest.mark.parametrize(
    "script", sorted(p.name for p in BENCH.glob("*.py") if p.name not in LIBRARIES)
)
def test_every_benchmark_takes_json(script: str) -> None:
    assert _takes_json(BENCH / script), f"bench/{script} has no --json"


def test_emit_prints_one_json_object_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    report.add_json_flag(parser)
    report.emit(parser.parse_args([]), {"x": 1})
    assert capsys.readouterr().out == ""
    print("a table")
    report.emit(parser.parse_args(["--json"]), {"b": 2.5, "a": [1, None]})
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == {"a": [1, None], "b": 2.5}
