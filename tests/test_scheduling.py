"""The xdist schedule (tests/scheduling.py) on small test trees run by pytester: the longest
files are collected first in an xdist worker, by their measured seconds or else by their
layers, and a serial run keeps the files' own order."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import scheduling

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

UNIT = "def test_one():\n    assert True\n\ndef test_two():\n    assert True\n"
E2E = "import pytest\n\n@pytest.mark.e2e\ndef test_whole_stack():\n    assert True\n"


class _Collected:
    """Reads the final order, after every collection hook has run."""

    def __init__(self) -> None:
        self.files: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            if not self.files or self.files[-1] != item.location[0]:
                self.files.append(item.location[0])


@pytest.fixture
def tree(pytester: pytest.Pytester, request: pytest.FixtureRequest) -> pytest.Pytester:
    markers = "\n    ".join(request.config.getini("markers"))
    pytester.makeini(
        "[pytest]\naddopts = -p tests.layers -p tests.scheduling --strict-markers\n"
        f"markers =\n    {markers}\n"
    )
    pytester.makepyfile(test_a=UNIT, test_b=UNIT, test_c=E2E, test_d=UNIT)
    return pytester


def _file_order(pytester: pytest.Pytester) -> list[str]:
    collected = _Collected()
    pytester.inline_run("--collect-only", plugins=[collected])
    return collected.files


def test_an_xdist_worker_collects_the_measured_longest_files_first(
    tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setattr(scheduling, "FILE_SECONDS", {"test_d.py": 500.0, "test_b.py": 200.0})
    assert _file_order(tree) == ["test_d.py", "test_b.py", "test_c.py", "test_a.py"]


def test_unmeasured_files_go_by_their_layers_and_ties_keep_their_order(
    tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setattr(scheduling, "FILE_SECONDS", {})
    assert _file_order(tree) == ["test_c.py", "test_a.py", "test_b.py", "test_d.py"]


def test_a_serial_run_keeps_the_order_on_disk(
    tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(scheduling, "FILE_SECONDS", {"test_d.py": 500.0})
    assert _file_order(tree) == ["test_a.py", "test_b.py", "test_c.py", "test_d.py"]


def test_every_measured_file_exists() -> None:
    """A renamed or deleted file's figure would silently stop steering the schedule."""
    missing = [path for path in scheduling.FILE_SECONDS if not (ROOT / path).is_file()]
    assert not missing, missing
