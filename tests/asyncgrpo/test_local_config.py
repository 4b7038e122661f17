"""asyncgrpo/local_config.py: the GPU memory split adds up to at most the whole GPU, and the run
config file is read and checked by the run config model, each refusal naming the file and the
field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from asyncgrpo.local_config import (
    GpuMemorySplit,
    LocalSettings,
    RunFileError,
    load_run_file,
    server_paths,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "runs"


def test_the_split_may_fill_the_gpu_but_not_more() -> None:
    assert GpuMemorySplit(vllm=0.6, learner=0.4).vllm == 0.6
    with pytest.raises(ValidationError, match=r"add up to 1\.2, more than the whole GPU"):
        GpuMemorySplit(vllm=0.7, learner=0.5)
    with pytest.raises(ValidationError, match="less than 1"):
        GpuMemorySplit(vllm=1.0, learner=0.1)


def test_the_split_comes_from_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCGRPO_LOCAL_GPU_MEMORY_VLLM", "0.8")
    monkeypatch.setenv("ASYNCGRPO_LOCAL_GPU_MEMORY_LEARNER", "0.3")
    with pytest.raises(ValidationError, match="add up to 1.1"):
        LocalSettings(run_file=Path("run.json"))


def test_an_unknown_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCGRPO_LOCAL_WORKER", "2")
    with pytest.raises(ValidationError, match="did you mean ASYNCGRPO_LOCAL_WORKERS"):
        LocalSettings(run_file=Path("run.json"))


@pytest.mark.parametrize("name", ["arithmetic.json", "gsm8k-qwen2.5-1.5b.json"])
def test_the_examples_load_with_overrides(name: str) -> None:
    config = load_run_file(EXAMPLES / name, {"max_versions": 2})
    assert config["max_versions"] == 2
    assert config["name"] == json.loads((EXAMPLES / name).read_text())["name"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read it"),
        ("{not json", "not JSON"),
        ("[1, 2]", "a run config is a JSON object, not list"),
        ('{"name": "x"}', "base_model: Field required"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "run.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(RunFileError) as caught:
        load_run_file(path, {})
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_bad_field_and_a_bad_override_name_the_field(tmp_path: Path) -> None:
    config = json.loads((EXAMPLES / "arithmetic.json").read_text())
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**config, "group_size": 1}))
    with pytest.raises(RunFileError, match="group_size: .*at least 2"):
        load_run_file(path, {})
    path.write_text(json.dumps(config))
    with pytest.raises(RunFileError, match="max_versions: .*must be between 1"):
        load_run_file(path, {"max_versions": 0})


def test_local_dataset_paths_are_taken_from_where_the_command_runs(tmp_path: Path) -> None:
    """The embedded server runs in the work dir: examples/runs/gsm8k-smollm2-cpu.json's
    relative data files must still point at the checkout's."""
    (tmp_path / "folder").mkdir()
    config = {
        "dataset": {"kind": "hf", "path": "json", "data_files": "data/train.jsonl"},
        "eval": {"dataset": {"kind": "hf", "path": "folder", "data_files": ["a.jsonl", "/b"]}},
    }
    out = server_paths(config, tmp_path)
    assert out["dataset"] == {"kind": "hf", "path": "json",
                              "data_files": str(tmp_path / "data/train.jsonl")}  # fmt: skip
    assert out["eval"]["dataset"]["path"] == str(tmp_path / "folder")
    assert out["eval"]["dataset"]["data_files"] == [str(tmp_path / "a.jsonl"), "/b"]
    hub = {"dataset": {"kind": "hf", "path": "openai/gsm8k"}, "eval": None}
    assert server_paths(hub, tmp_path)["dataset"]["path"] == "openai/gsm8k"
