"""asyncgrpo/local.py: where `asyncgrpo local` runs its processes and the settings it hands
them, read back by the worker's and the learner's own settings models (so a misspelt variable
or a lost share fails here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asyncgrpo.local import (
    LocalError,
    Placement,
    cuda_gpu_name,
    learner_env,
    local_plan,
    place,
    vllm_importable,
    vllm_lora_rank,
)
from asyncgrpo.local_config import GpuMemorySplit, LocalSettings, load_run_file
from learner.config import LearnerSettings
from protocol.run_config import RunConfig
from worker.config import WorkerSettings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "runs"
CUDA_VLLM = Placement(device="cuda", backend="vllm", dtype="bfloat16", gpu_type="H100")


def _settings(**values: object) -> LocalSettings:
    return LocalSettings(run_file=EXAMPLES / "gsm8k-qwen2.5-1.5b.json", **values)  # type: ignore[arg-type]


def _worker(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return WorkerSettings(server_url="http://127.0.0.1:1")


def _learner(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> LearnerSettings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return LearnerSettings(server_url="http://127.0.0.1:1", run_id="r", token="t")


def test_on_cuda_each_vllm_worker_takes_its_part_and_the_learner_its_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _settings(workers=3, gpu_memory=GpuMemorySplit(vllm=0.6, learner=0.3))
    config = load_run_file(settings.run_file, {})
    plan = local_plan(settings, config, CUDA_VLLM)
    assert plan.workers == 3 and plan.cluster.model == "Qwen/Qwen2.5-1.5B-Instruct"
    worker = _worker(plan.cluster.worker_env, monkeypatch)
    assert worker.backend == "vllm" and worker.dtype == "bfloat16" and worker.gpu_type == "H100"
    assert worker.vllm.gpu_memory_utilization == pytest.approx(0.2, abs=1e-4)
    assert worker.vllm.max_lora_rank == 32  # the run's lora.rank
    learner = _learner(plan.cluster.learner_env, monkeypatch)
    assert (learner.device, learner.dtype) == ("cuda", "bfloat16")
    assert learner.gpu_memory_fraction == pytest.approx(0.3)


def test_on_cpu_the_split_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(device="cpu", gpu_memory=GpuMemorySplit(vllm=0.1, learner=0.2))
    placement = place(settings)
    assert placement == Placement("cpu", "transformers", "float32", "cpu")
    plan = local_plan(settings, load_run_file(settings.run_file, {}), placement)
    assert not any("GPU_MEMORY" in name for name in plan.cluster.worker_env)
    learner = _learner(learner_env(settings, placement), monkeypatch)
    assert learner.gpu_memory_fraction is None and learner.device == "cpu"
    worker = _worker(plan.cluster.worker_env, monkeypatch)
    assert (worker.backend, worker.device, worker.dtype) == ("transformers", "cpu", "float32")


def test_cuda_asked_of_a_machine_without_it_is_refused() -> None:
    with pytest.raises(LocalError, match="sees no CUDA device"):
        place(_settings(device="cuda"), gpu_name=lambda: None)
    assert place(_settings(device="auto"), gpu_name=lambda: None).device == "cpu"
    on_gpu = place(_settings(device="auto", backend="transformers"), gpu_name=lambda: "L4")
    assert on_gpu == Placement("cuda", "transformers", "bfloat16", "L4")


@pytest.mark.integration  # imports torch: about 20 s on two loaded cores
def test_this_machines_torch_decides_auto() -> None:
    pytest.importorskip("torch")
    import torch

    gpu = cuda_gpu_name()
    assert (gpu is not None) == torch.cuda.is_available()
    assert place(_settings(device="auto", backend="transformers")).device == (
        "cuda" if gpu else "cpu"
    )


def test_vllm_rank_is_the_smallest_that_holds_the_adapter() -> None:
    assert [vllm_lora_rank(r) for r in (1, 8, 9, 32, 33, 512)] == [8, 8, 16, 32, 64, 512]
    with pytest.raises(LocalError, match="above vLLM's largest"):
        vllm_lora_rank(513)


def test_a_run_rank_above_vllms_is_refused_before_anything_starts() -> None:
    settings = _settings()
    config = load_run_file(settings.run_file, {})
    config["lora"] = {**config["lora"], "rank": 1024, "alpha": 1024.0}
    RunConfig.model_validate(config)
    with pytest.raises(LocalError, match="lora.rank 1024"):
        local_plan(settings, config, CUDA_VLLM)


@pytest.mark.integration  # a child interpreter
def test_vllm_forced_where_it_cannot_be_imported_is_refused(subprocess_allowed: None) -> None:
    if vllm_importable(sys.executable):
        pytest.skip("vllm is importable here")
    with pytest.raises(LocalError, match="cannot import vllm"):
        place(_settings(device="cpu", backend="vllm"))
    assert place(_settings(device="cpu", backend="auto")).backend == "transformers"
