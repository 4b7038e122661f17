"""The GSM8K examples in examples/runs: both validate against the run schema (the Hub cannot be
reached here, so the GPU example is checked as a document); the CPU example's own data files
make a run that prepares its 512 training prompts and 64 eval prompts through the hf kind."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from protocol.run_config import HfDataset, RunConfig
from server.models import EvalRow

ROOT = Path(__file__).resolve().parents[3]
RUNS = ROOT / "examples" / "runs"


def _load(name: str) -> dict[str, Any]:
    return json.loads((RUNS / name).read_text())


def test_every_example_run_validates() -> None:
    """Every file under examples/runs/ (whatever its suffix) and the demo's run are run configs
    that `POST /api/v1/runs` takes as they are: JSON, valid, no unknown field."""
    files = sorted(p for p in RUNS.rglob("*") if p.is_file())
    names = {p.name for p in files}
    assert {"arithmetic.json", "gsm8k-qwen2.5-1.5b.json", "gsm8k-smollm2-cpu.json"} <= names
    for path in [*files, ROOT / "asyncgrpo" / "demo_run.json"]:
        try:
            RunConfig.model_validate(json.loads(path.read_text()))
        except ValueError as exc:  # json.JSONDecodeError and pydantic's ValidationError
            raise AssertionError(f"{path.relative_to(ROOT)}: {exc}") from None


def test_gpu_example_is_gsm8k_with_math_verify_and_a_test_split_eval() -> None:
    config = RunConfig.model_validate(_load("gsm8k-qwen2.5-1.5b.json"))
    train, held_out = config.dataset, config.eval and config.eval.dataset
    assert isinstance(train, HfDataset) and isinstance(held_out, HfDataset)
    assert (train.path, train.name, train.split) == ("openai/gsm8k", "main", "train")
    assert (held_out.path, held_out.split) == ("openai/gsm8k", "test")
    assert train.prompt_column == held_out.prompt_column == "question"
    assert [(r.name, r.kwargs) for r in config.rewards] == [("math_verify", {"column": "answer"})]
    assert config.eval is not None and config.eval.accuracy_reward == "math_verify"


def _absolute(dataset: dict[str, Any]) -> dict[str, Any]:
    return {**dataset, "data_files": str(ROOT / dataset["data_files"])}


def test_cpu_example_prepares_from_its_own_files(ds_app, ds_client, admin, run_jobs):  # type: ignore[no-untyped-def]
    raw = _load("gsm8k-smollm2-cpu.json")
    raw["dataset"] = _absolute(raw["dataset"])
    raw["eval"]["dataset"] = _absolute(raw["eval"]["dataset"])
    created = ds_client.post("/api/v1/runs", json=raw, headers=admin)
    assert created.status_code == 201, created.text
    run_id = created.json()["run"]["id"]
    run_jobs("datasets", "run_prep")
    run = ds_client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert run["status"] == "pending", run
    assert run["stats"]["prompt_rows"] == {"queued": 512}
    with ds_app.state.sessionmaker() as session:
        n_eval = session.execute(
            select(func.count()).where(EvalRow.run_id == uuid.UUID(run_id))
        ).scalar_one()
        session.rollback()
    assert n_eval == 64
