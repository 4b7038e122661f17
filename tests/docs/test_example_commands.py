"""The commands the pages give run as given (issue 49): a shell block that creates a run from
`examples/runs/<file>` starts its learner and workers with that file's `base_model` (another is
refused, 409 `model_mismatch`), a vLLM worker for it accepts the run's LoRA rank
(`--vllm-max-lora-rank`, default 16) and generates in a GPU's dtype (`--dtype`, default
`auto`)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from learner.config import LearnerSettings
from worker.config import VllmSettings, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
EXAMPLE = re.compile(r"examples/runs/([\w.-]+\.json)")


def _blocks() -> Iterator[tuple[str, str]]:
    """Each shell block of each page, then each `## ` section's blocks as one (a walk-through
    creates the run in one block and starts its learner and workers in later ones)."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in BLOCK.findall(text):
            yield str(page.relative_to(ROOT)), block
        sections = re.split(r"^## ", text, flags=re.M)[1:]
        for section in sections:
            found = BLOCK.findall(section)
            if len(found) > 1:
                yield f"{page.relative_to(ROOT)} ({section.splitlines()[0]})", "\n".join(found)


def _commands(block: str, part: str) -> list[list[str]]:
    """Each `asyncgrpo <part> …` command of the block, as words (continuations joined)."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        code = line.split(" #")[0]
        if f"asyncgrpo {part}" not in code:
            continue
        words = shlex.split(code[code.index(f"asyncgrpo {part}") :])
        found.append(words[2:])
    return found


def _option(words: list[str], name: str) -> str | None:
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


CASES = [
    (page, name, block)
    for page, block in _blocks()
    for name in sorted(set(EXAMPLE.findall(block)))
    if _commands(block, "learner") or _commands(block, "worker")
]


def test_the_pages_that_start_a_run_are_checked() -> None:
    pages = {page for page, _, _ in CASES}
    assert {"README.md", "docs/guides/real-run.md", "docs/guides/evaluation.md"} <= pages
    walk_through = "docs/guides/first-gpu-run.md (Part B: a control plane, a learner and workers"
    assert any(page.startswith(walk_through) for page in pages), sorted(pages)


@pytest.mark.parametrize(("page", "name", "block"), CASES, ids=[f"{p}:{n}" for p, n, _ in CASES])
def test_a_block_starts_its_runs_learner_and_workers_as_the_run_needs(
    page: str, name: str, block: str
) -> None:
    config = json.loads((ROOT / "examples" / "runs" / name).read_text())
    model, rank = config["base_model"], config["lora"]["rank"]
    learner_default = LearnerSettings.model_fields["model"].default
    for words in _commands(block, "learner"):
        assert (_option(words, "--model") or learner_default) == model, (page, words)
    for words in _commands(block, "worker"):
        assert (_option(words, "--model") or WorkerSettings.model_fields["model"].default) == model
        if _option(words, "--backend") == "vllm":
            default_rank = VllmSettings.model_fields["max_lora_rank"].default
            assert int(_option(words, "--vllm-max-lora-rank") or default_rank) >= rank, page
            # a GPU worker names its dtype unless the default picks the GPU's (auto)
            dtype = _option(words, "--dtype") or WorkerSettings.model_fields["dtype"].default
            assert dtype in ("auto", "bfloat16", "float16"), (page, words)
