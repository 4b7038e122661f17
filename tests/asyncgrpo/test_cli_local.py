"""`asyncgrpo local`: a bad run file or a bad setting is one line and exit 2, before any process
starts, never a traceback; the options are the settings' fields (asyncgrpo/local_config.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from asyncgrpo.cli import app
from asyncgrpo.local_config import LocalSettings
from protocol.settings_env import setting_variables

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "runs" / "arithmetic.json"


def _local(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["local", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (None, [], "cannot read it"),
        ("{", [], "not JSON"),
        (json.dumps({"name": "x", "base_model": "m"}), [], "dataset: Field required"),
        ("EXAMPLE", ["--max-versions", "0"], "max_versions: Input should be greater than"),
        ("EXAMPLE", ["--gpu-memory-vllm", "0.7", "--gpu-memory-learner", "0.5"],
         "gpu_memory: the vLLM workers' share (0.7) and the learner's (0.5) add up to 1.2"),
        ("EXAMPLE", ["--gpu-memory-vllm", "1.5"], "gpu_memory.vllm: Input should be less than 1"),
        ("EXAMPLE", ["--device", "tpu"], "'tpu' is not one of"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, content: str | None, args: list[str], message: str
) -> None:
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(EXAMPLE.read_text() if content == "EXAMPLE" else content)
    code, output = _local(str(path), *args, "--dir", str(tmp_path / "work"))
    assert code == 2, output
    assert message in output, output
    assert "Traceback" not in output
    assert not (tmp_path / "work").exists()  # refused before anything started


def test_the_run_file_is_required_and_the_help_lists_the_split() -> None:
    code, output = _local()
    assert code == 2 and "Missing argument 'RUN_FILE'" in output, output
    code, output = _local("--help")
    assert code == 0
    for option in ("--device", "--workers", "--backend", "--gpu-memory-vllm", "--max-versions"):
        assert option in output, output


def test_every_option_is_its_environment_name() -> None:
    """ASYNCGRPO_LOCAL_<OPTION> for each option (the split's too); the run file is the
    argument."""
    group: Any = typer.main.get_command(app)
    params = group.commands["local"].params
    options = [o for p in params if p.param_type_name == "option" for o in p.opts]
    names = {"ASYNCGRPO_LOCAL_" + o[2:].replace("-", "_").upper() for o in options}
    assert names - {"ASYNCGRPO_LOCAL_HELP"} == set(setting_variables(LocalSettings)) - {
        "ASYNCGRPO_LOCAL_RUN_FILE"
    }
    assert [p.name for p in params if p.param_type_name == "argument"] == ["run_file"]
