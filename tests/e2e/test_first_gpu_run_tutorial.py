"""docs/guides/first-gpu-run.md, "Try it on CPU first", runs as written (issue 49): its blocks,
each after its `<!-- tutorial-cpu: NAME -->` marker, are taken from the page and run with bash
in the order written, from a folder that holds the checkout's `examples/` (as the page runs
them from the checkout), the long-running ones (`background` in the marker: the server, the
learner, the worker) as processes of their own, as the page starts them in terminals of their
own. The one substitution is the port (`8000`, declared below). The blocks wait on their own
conditions (the server's /healthz, the run's status); each has a deadline here, and a
background process that dies fails the test at once (the learner may exit 0: it does once the
run is completed). The run (one version, its eval on two prompts) completes; the best adapter
that comes out is version 1, a PEFT adapter whose weights load."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from asyncgrpo.cluster import ManagedProcess, free_port, process_env, stop_all

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guides" / "first-gpu-run.md"
MARKED = re.compile(r"<!-- tutorial-cpu: ([\w ]+?) -->\n```bash\n(.*?)```", re.S)
STEPS = [
    "settings", "server", "tokens and run", "doctor learner", "learner", "doctor worker", "worker",
    "watch", "adapter out",
]  # fmt: skip
PORT = "8000"  # the page's port, replaced by a free one
STEP_S = {"watch": 420.0}  # two model loads, then one version, on two shared cores
DEFAULT_STEP_S = 120.0
STOP_S = 15.0


def blocks() -> list[tuple[str, bool, str]]:
    """(name, background, text) of each marked block, in the page's order."""
    found = []
    for marker, text in MARKED.findall(PAGE.read_text(encoding="utf-8")):
        words = marker.split()
        background = words[-1] == "background"
        found.append((" ".join(words[:-1] if background else words), background, text))
    return found


def test_the_page_marks_every_step_of_the_cpu_walk_through() -> None:
    found = blocks()
    assert [name for name, _, _ in found] == STEPS
    assert [name for name, background, _ in found if background] == ["server", "learner", "worker"]
    assert all(PORT in text for name, _, text in found if name in ("settings", "server"))


def _done(proc: ManagedProcess) -> bool:
    return proc.name == "learner" and proc.returncode() == 0


def _failure(procs: list[ManagedProcess], what: str) -> str:
    logs = [f"--- {p.name} (rc={p.returncode()}) ---\n{p.log_text()[-4000:]}" for p in procs]
    return f"{what}\n" + "\n".join(logs)


# e2e: the server, the learner and a worker as processes of their own, with the real model
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="curl, jq")
@pytest.mark.timeout(sum(STEP_S.get(s, DEFAULT_STEP_S) for s in STEPS) + 60)
def test_the_cpu_walk_through_reaches_a_completed_run_and_its_adapter(
    tmp_path: Path, small_model_dir: str
) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the page runs from the checkout
    port = str(free_port())
    env = process_env(
        {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin:/bin"])}
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    started: list[ManagedProcess] = []
    background: list[ManagedProcess] = []
    try:
        for name, in_background, text in blocks():
            script = text.replace(PORT, port)
            argv = ["bash", "-euo", "pipefail", "-c", script]
            proc = ManagedProcess(name, argv, env, tmp_path, logs / f"{name}.log").start()
            started.append(proc)
            if in_background:
                background.append(proc)
                continue
            deadline = time.monotonic() + STEP_S.get(name, DEFAULT_STEP_S)
            while proc.alive():
                # the learner exits 0 once the run is completed; the others run until stopped
                dead = [p for p in background if not p.alive() and not _done(p)]
                assert not dead, _failure([*background, proc], f"{name}: a process died")
                assert time.monotonic() < deadline, _failure([*background, proc], f"{name}: late")
                time.sleep(0.5)
            assert proc.returncode() == 0, _failure([*background, proc], f"{name} failed")
        work = tmp_path / "tutorial-cpu"
        status = json.loads((work / "status.json").read_text())
        assert (status["status"], status["current_version"]) == ("completed", 1), status
        # versions 0 (the base model) and 1 were evaluated: the best trained one is 1
        assert (work / "best").read_text().strip() == "1"
        assert json.loads((work / "adapter.json").read_text())["version"] == 1
        config = json.loads((work / "adapter" / "adapter_config.json").read_text())
        assert config["r"] == 16 and config["peft_type"] == "LORA", config
        from safetensors.torch import load_file

        weights = load_file(str(work / "adapter" / "adapter_model.safetensors"))
        assert weights and any("lora_A" in key for key in weights), sorted(weights)[:5]
        learner = next(p for p in background if p.name == "learner")
        assert learner.wait(STOP_S) == 0, learner.log_text()[-3000:]
    finally:
        stop_all(started, grace_s=STOP_S)
