"""lm.adapter_io: a version folder written from a PEFT LoRA model loads unchanged with
PeftModel.from_pretrained and gives identical outputs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from lm.adapter_io import load_adapter_version, save_adapter_version
from lm.logprobs import completion_logprobs
from protocol.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterMismatch, verify_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def lora_model(small_model: Any) -> Any:
    torch.set_num_threads(1)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(copy.deepcopy(small_model), config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # PEFT initialises B to zero: make the adapter do something
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    model.eval()
    return model


def _logits(model: Any, tokenizer: Any) -> torch.Tensor:
    ids = tokenizer("The quick brown fox", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits  # (1, L, V)


def test_version_folder_loads_unchanged(
    tmp_path: Path, lora_model: Any, small_model: Any, small_tokenizer: Any
) -> None:
    folder = tmp_path / "v000001"
    manifest = save_adapter_version(lora_model, folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([ADAPTER_CONFIG, ADAPTER_WEIGHTS])
    assert {f.name for f in manifest.files} == {ADAPTER_CONFIG, ADAPTER_WEIGHTS}
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    assert config["r"] == 4 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]

    loaded = PeftModel.from_pretrained(copy.deepcopy(small_model), str(folder))
    loaded.eval()
    verify_folder(folder, manifest)  # loading did not touch the files
    want = {k: v for k, v in lora_model.state_dict().items() if "lora_" in k}
    got = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert want.keys() == got.keys() and want
    assert all(torch.equal(want[k], got[k]) for k in want)

    expected = _logits(lora_model, small_tokenizer)
    assert torch.equal(_logits(loaded, small_tokenizer), expected)
    assert not torch.allclose(_logits(small_model, small_tokenizer), expected, atol=1e-3)


def test_load_verifies_the_manifest_and_scores_with_or_without_adapter(
    tmp_path: Path, lora_model: Any, small_model: Any, small_tokenizer: Any
) -> None:
    folder = tmp_path / "v000002"
    manifest = save_adapter_version(lora_model, folder)
    with pytest.raises(FileExistsError):
        save_adapter_version(lora_model, folder)
    model = load_adapter_version(copy.deepcopy(small_model), folder, manifest=manifest)
    prompt, completion = [[1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198]], [[28, 29, 2]]
    eos = small_tokenizer.eos_token_id
    with_adapter = completion_logprobs(model, prompt, completion, 1.0, pad_id=eos)
    reference = completion_logprobs(lora_model, prompt, completion, 1.0, pad_id=eos)
    base = completion_logprobs(model, prompt, completion, 1.0, pad_id=eos, use_adapter=False)
    plain = completion_logprobs(small_model, prompt, completion, 1.0, pad_id=eos)
    assert with_adapter == reference
    assert torch.allclose(torch.tensor(base), torch.tensor(plain), atol=1e-6)
    assert with_adapter != base

    (folder / ADAPTER_WEIGHTS).write_bytes(b"\x00" * 16)
    with pytest.raises(AdapterMismatch):
        load_adapter_version(copy.deepcopy(small_model), folder, manifest=manifest)


def test_weights_written_into_an_adapter_of_the_same_shape(
    lora_model: Any, small_model: Any, small_tokenizer: Any, tmp_path: Path
) -> None:
    """write_adapter_weights turns an adapter built for one version into another of the same
    shape: the same outputs as loading that version afresh. Another shape is refused."""
    from lm.adapter_io import same_adapter_shape, write_adapter_weights

    save_adapter_version(lora_model, tmp_path / "v1")
    second_model = copy.deepcopy(lora_model)
    with torch.no_grad():
        for name, param in second_model.named_parameters():
            if "lora_A" in name:
                param.mul_(-2.0)
    save_adapter_version(second_model, tmp_path / "v2")
    assert same_adapter_shape(tmp_path / "v1", tmp_path / "v2")

    slot = load_adapter_version(copy.deepcopy(small_model), tmp_path / "v1")
    before = _logits(slot, small_tokenizer)
    write_adapter_weights(slot, tmp_path / "v2", "default")
    fresh = load_adapter_version(copy.deepcopy(small_model), tmp_path / "v2")
    assert torch.allclose(_logits(slot, small_tokenizer), _logits(fresh, small_tokenizer))
    assert not torch.allclose(before, _logits(slot, small_tokenizer))

    wider = get_peft_model(
        copy.deepcopy(small_model),
        LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
    )
    save_adapter_version(wider, tmp_path / "r8")
    assert not same_adapter_shape(tmp_path / "v1", tmp_path / "r8")
    with pytest.raises(ValueError, match="do not fit"):
        write_adapter_weights(slot, tmp_path / "r8", "default")


def test_the_same_shape_whatever_order_the_target_modules_were_written_in(
    lora_model: Any, tmp_path: Path
) -> None:
    """PEFT writes `target_modules` (a set) in the set's iteration order, which changes with the
    process's hash seed and between copies of a model: a learner resumed in a new process wrote
    ["v_proj", "q_proj"] after ["q_proj", "v_proj"]. Same adapter shape all the same; a
    different rank or module set is not."""
    from lm.adapter_io import same_adapter_shape

    save_adapter_version(lora_model, tmp_path / "v1")
    config = json.loads((tmp_path / "v1" / ADAPTER_CONFIG).read_text())
    for name, change in {
        "reordered": {"target_modules": list(reversed(config["target_modules"]))},
        "rank": {"r": config["r"] * 2},
        "modules": {"target_modules": ["q_proj"]},
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / ADAPTER_CONFIG).write_text(json.dumps({**config, **change}))
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert same_adapter_shape(tmp_path / "v1", tmp_path / "reordered")
    assert not same_adapter_shape(tmp_path / "v1", tmp_path / "rank")
    assert not same_adapter_shape(tmp_path / "v1", tmp_path / "modules")


def test_a_snapshot_saves_the_weights_of_its_moment(tmp_path: Path, lora_model: Any) -> None:
    """save_adapter_version(state_dict=snapshot) writes the snapshot's weights even after the
    model moved on (the learner's background publish), and the same files as a live save."""
    from safetensors.torch import load_file

    from lm.adapter_io import snapshot_adapter

    live = save_adapter_version(lora_model, tmp_path / "live")
    snapshot = snapshot_adapter(lora_model)
    assert snapshot and all("lora_" in name for name in snapshot)
    saved = {n: p.detach().clone() for n, p in lora_model.named_parameters() if p.requires_grad}
    try:
        with torch.no_grad():
            for p in lora_model.parameters():
                if p.requires_grad:
                    p.add_(1.0)  # training moves on
        frozen = save_adapter_version(lora_model, tmp_path / "frozen", state_dict=snapshot)
        moved = save_adapter_version(lora_model, tmp_path / "moved")
    finally:
        with torch.no_grad():
            for name, p in lora_model.named_parameters():
                if name in saved:
                    p.copy_(saved[name])
    assert frozen.version_sha256() == live.version_sha256()
    assert moved.version_sha256() != live.version_sha256()
    a = load_file(str(tmp_path / "frozen" / ADAPTER_WEIGHTS))
    b = load_file(str(tmp_path / "live" / ADAPTER_WEIGHTS))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
