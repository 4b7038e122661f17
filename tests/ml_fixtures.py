"""Small-model fixtures (owned by the format/model work): the real SmolLM2-135M-Instruct,
resolved once per session into the model cache (ASYNCGRPO_MODEL_CACHE or
~/.cache/asyncgrpo/models) and loaded at most once per session."""

from __future__ import annotations

from typing import Any

import pytest

SMALL_MODEL_ALIAS = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def small_model_dir() -> str:
    """The HF folder of the small model (converted from its GGUF on first use)."""
    from lm.models import resolve_model

    return resolve_model(SMALL_MODEL_ALIAS)


@pytest.fixture(scope="session")
def small_tokenizer(small_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(small_model_dir)


@pytest.fixture(scope="session")
def small_model(small_model_dir: str) -> Any:
    """The small model in fp32, eval mode, one torch thread. Shared: never wrap it with PEFT
    in place (PEFT modifies its base); deep-copy it first."""
    from lm.models import load_model

    return load_model(small_model_dir, num_threads=1)
