"""Worker test fixtures: the transformers backend on the real small model, and real PEFT
adapter versions made from it (LoRA r=4 on q/v with random B, so they change the outputs)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lm.chat import tokenizer_fingerprint
from tests.harness.fixtures import server
from tests.harness.runs import run_config
from tests.harness.stack import LiveServer
from tests.worker.harness import RUNNING, Stack, worker_run

__all__ = ["server"]  # tests/harness/fixtures.py
SMALL_MODEL = "smollm2-135m-instruct"
PROMPTS = [
    "What is 7 + 5? Answer with just the number.",
    [{"role": "user", "content": "Name one primary color."}],
]


def make_adapter_version(base: Any, out_dir: Path, seed: int, rank: int = 4) -> Path:
    """A real PEFT adapter version folder (lm.adapter_io) with non-zero LoRA weights."""
    import torch
    from peft import LoraConfig, get_peft_model

    from lm.adapter_io import save_adapter_version

    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=False,  # random A and B: the adapter visibly changes log-probs
    )
    peft = get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.mul_(0.5)
    save_adapter_version(peft, out_dir)
    return out_dir


@pytest.fixture(scope="session")
def adapter_dirs(small_model: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Adapter versions 1 and 2 as folders on disk."""
    root = tmp_path_factory.mktemp("adapters")
    return {v: make_adapter_version(small_model, root / f"v{v:06d}", seed=v) for v in (1, 2)}


@pytest.fixture(scope="module")
def tx_backend() -> Iterator[Any]:
    from worker.backends.transformers import TransformersBackend

    backend = TransformersBackend(SMALL_MODEL, num_threads=1, max_loaded_adapters=1)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def prompt_ids(small_tokenizer: Any) -> list[list[int]]:
    from lm.chat import encode_prompt

    return [encode_prompt(small_tokenizer, p, "You are a helpful assistant.") for p in PROMPTS]


@pytest.fixture
def make_stack(server: LiveServer, small_tokenizer: Any) -> Iterator[Callable[..., Stack]]:
    stacks: list[Stack] = []

    def make(n_prompts: int, **overrides: Any) -> Stack:
        stack = Stack(
            server,
            tokenizer_fingerprint(small_tokenizer),
            run_config(worker_run(n_prompts), **overrides),
        )
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()


@pytest.fixture(autouse=True)
def _stop_loops() -> Iterator[None]:
    """A failed test must not leave a worker loop running into the next one."""
    yield
    while RUNNING:
        loop = RUNNING.pop()
        loop.loop.request_stop()
        loop.thread.join(10)
