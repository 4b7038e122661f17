"""A version's adapter_config.json names the run's base model, not the local folder the
learner loaded it from (an alias's conversion in that machine's cache); a built-in alias by the
Hugging Face id of its model, which PEFT and vLLM users can resolve."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from lm.adapter_io import save_adapter_version
from lm.models import ALIASES
from protocol.adapters import ADAPTER_CONFIG


def _tiny_base(folder: Path) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    model: LlamaForCausalLM = LlamaForCausalLM.from_pretrained(folder)  # as from a cache folder
    return model


def test_the_config_names_the_runs_base_model_and_still_loads(tmp_path: Path) -> None:
    cache_folder = tmp_path / "cache" / "smollm2-135m-instruct"
    lora = LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(_tiny_base(cache_folder), lora)

    save_adapter_version(model, tmp_path / "as-loaded")
    as_loaded = json.loads((tmp_path / "as-loaded" / ADAPTER_CONFIG).read_text())
    assert as_loaded["base_model_name_or_path"] == str(cache_folder)  # what PEFT writes

    save_adapter_version(model, tmp_path / "v1", base_model="smollm2-135m-instruct")
    config = json.loads((tmp_path / "v1" / ADAPTER_CONFIG).read_text())
    hub_id = ALIASES["smollm2-135m-instruct"].hub_id
    assert config["base_model_name_or_path"] == hub_id
    assert {k: v for k, v in config.items() if k != "base_model_name_or_path"} == {
        k: v for k, v in as_loaded.items() if k != "base_model_name_or_path"
    }
    loaded = PeftModel.from_pretrained(_tiny_base(tmp_path / "elsewhere"), str(tmp_path / "v1"))
    assert loaded.peft_config["default"].base_model_name_or_path == hub_id
    # what a user loading the final adapter outside asyncgrpo reads first (the CI guide's recipe)
    assert PeftConfig.from_pretrained(str(tmp_path / "v1")).base_model_name_or_path == hub_id


def test_the_alias_is_named_by_its_hub_id_and_other_names_pass_unchanged(tmp_path: Path) -> None:
    assert ALIASES["smollm2-135m-instruct"].hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    lora = LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(_tiny_base(tmp_path / "base"), lora)
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", str(tmp_path / "my-model")):
        out = tmp_path / f"v-{len(name)}"
        save_adapter_version(model, out, base_model=name)
        assert PeftConfig.from_pretrained(str(out)).base_model_name_or_path == name


CI_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "ci.md"


def _guide_python_block(containing: str) -> str:
    """docs/guides/ci.md, "Using the final adapter outside asyncgrpo": its one block with it."""
    blocks = re.findall(r"```python\n(.*?)```", CI_GUIDE.read_text(), flags=re.DOTALL)
    found = [block for block in blocks if containing in block]
    assert len(found) == 1, f"{len(found)} python blocks of {CI_GUIDE.name} hold {containing!r}"
    return found[0]


def test_the_guide_recipe_loads_a_final_adapter_with_peft(
    small_model: Any, small_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CI guide's PEFT recipe, run as written on a final adapter of the real small model
    (its base named by a local folder here: this machine has no Hub access)."""
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    save_adapter_version(
        get_peft_model(copy.deepcopy(small_model), lora), tmp_path / "final",
        base_model=small_model_dir,
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(_guide_python_block("PeftModel.from_pretrained"), scope)
    assert scope["base_id"] == small_model_dir
    assert isinstance(scope["model"], PeftModel)
    assert not any("lora_" in name for name, _ in scope["merged"].named_parameters())
