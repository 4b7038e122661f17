"""Adapter version folders: PEFT's adapter_model.safetensors + adapter_config.json, nothing else.

A version folder loads unchanged with `PeftModel.from_pretrained` and vLLM's `LoRARequest`.
Uploading it (conditional puts, `If-None-Match: *`) is the learner's job; this module writes and
reads the local folder and computes its manifest (protocol.adapters).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from protocol.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    REQUIRED_FILES,
    AdapterManifest,
    manifest_of,
    verify_folder,
)

DEFAULT_ADAPTER = "default"  # PEFT's name for a model's one adapter


def save_adapter_version(
    peft_model: Any,
    out_dir: Path,
    state_dict: dict[str, Any] | None = None,
    *,
    base_model: str | None = None,
    adapter_name: str = DEFAULT_ADAPTER,
) -> AdapterManifest:
    """Write the model's adapter `adapter_name` as a version folder; return its manifest.

    `out_dir` must not exist yet (versions are immutable); it is filled through a temporary
    folder and renamed into place. `state_dict` (the model's parameters by name, e.g. a
    snapshot `snapshot_adapter` took) is written instead of the live weights, so a version
    can be saved from another thread while training moves the model on. `base_model` (the
    run's; a built-in alias as its Hugging Face id) becomes the config's
    `base_model_name_or_path` in place of the local folder the
    model was loaded from (an alias's conversion in this machine's cache), so a downloaded
    version names the model it belongs to on any machine.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; adapter versions are immutable")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=out_dir.name + ".tmp-") as tmp:
        raw = Path(tmp) / "peft"
        extra = {} if state_dict is None else {"state_dict": state_dict}
        peft_model.save_pretrained(
            str(raw), safe_serialization=True, selected_adapters=[adapter_name], **extra
        )
        if adapter_name != DEFAULT_ADAPTER:  # PEFT writes any other adapter in a subfolder
            raw = raw / adapter_name
        staged = Path(tmp) / "version"
        staged.mkdir()
        for name in REQUIRED_FILES:
            shutil.move(str(raw / name), staged / name)
        if base_model is not None:
            _set_base_model(staged / ADAPTER_CONFIG, base_model)
        staged.chmod(0o755)
        staged.rename(out_dir)
    return manifest_of(out_dir)


def _set_base_model(config_file: Path, base_model: str) -> None:
    from lm.models import hub_id

    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = hub_id(base_model)  # an alias means nothing elsewhere
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def adapter_parameters(
    peft_model: Any, adapter_name: str = DEFAULT_ADAPTER
) -> list[tuple[str, Any]]:
    """The (name, parameter) pairs of one adapter's LoRA weights, in the model's order. A
    model may hold several adapters (a pool learner's runs, learner/shared_base.py): PEFT
    names the parameter of adapter `a` `….lora_A.a.weight` (or `….<name>.a`)."""
    return [
        (name, p)
        for name, p in peft_model.named_parameters()
        if "lora_" in name and f".{adapter_name}." in name + "."
    ]


def canonical_name(name: str, adapter_name: str) -> str:
    """A parameter's name as it is in a model whose only adapter is PEFT's `default`, so that a
    checkpoint's names are the same whichever adapter name the run had in the learner that
    wrote it (a per-run learner's `default`, a pool learner's own name for the run)."""
    if adapter_name == DEFAULT_ADAPTER:
        return name
    head, sep, tail = (name + ".").partition(f".{adapter_name}.")
    if not sep:
        raise ValueError(f"{name!r} is not a parameter of adapter {adapter_name!r}")
    return f"{head}.{DEFAULT_ADAPTER}.{tail}".rstrip(".")


def snapshot_adapter(peft_model: Any, adapter_name: str = DEFAULT_ADAPTER) -> dict[str, Any]:
    """A CPU copy of one adapter's (LoRA) parameters, by parameter name."""
    return {
        name: p.detach().to("cpu", copy=True)
        for name, p in adapter_parameters(peft_model, adapter_name)
    }


def load_adapter_version(
    base_model: Any,
    folder: Path,
    *,
    manifest: AdapterManifest | None = None,
    is_trainable: bool = False,
    adapter_name: str = DEFAULT_ADAPTER,
) -> Any:
    """Wrap `base_model` (modified in place, as PEFT does) with a version folder's adapter,
    named `adapter_name`; a model that is a PEFT model already gains it as one more adapter.

    With a manifest, the files are verified first (sha256 and size; AdapterMismatch otherwise).
    """
    from peft import PeftModel

    if manifest is not None:
        verify_folder(Path(folder), manifest)
    if isinstance(base_model, PeftModel):
        base_model.load_adapter(str(folder), adapter_name, is_trainable=is_trainable)
        model = base_model
    else:
        model = PeftModel.from_pretrained(
            base_model, str(folder), adapter_name=adapter_name, is_trainable=is_trainable
        )
    if not is_trainable:
        model.eval()
    return model


def same_adapter_shape(a: Path, b: Path) -> bool:
    """Two version folders whose adapters have the same configuration (rank, alpha, target
    modules, …): the weights of one fit the modules built for the other. Compared as PEFT's
    configs, not as JSON: PEFT keeps `target_modules` as a set and writes it in the set's
    iteration order, which differs between processes (hash seeds) and even between copies."""
    return bool(_adapter_config(a) == _adapter_config(b))


def _adapter_config(folder: Path) -> Any:
    from peft import PeftConfig

    saved = json.loads((Path(folder) / ADAPTER_CONFIG).read_text())
    return PeftConfig.from_peft_type(**PeftConfig.check_kwargs(**saved))


def read_adapter_weights(folder: Path) -> dict[str, Any]:
    """A version folder's saved LoRA tensors (read before the write, e.g. off the thread that
    generates, so that the write is only the copy)."""
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / ADAPTER_WEIGHTS))


def write_adapter_weights(
    peft_model: Any, folder: Path, adapter_name: str, state: dict[str, Any] | None = None
) -> None:
    """Copy a version folder's LoRA weights (or `state`, read from it already) into an adapter
    the model already has (built for a version of the same shape, `same_adapter_shape`): about
    the cost of a copy of the bytes, where building a new adapter re-creates its modules. Every
    LoRA parameter of `adapter_name` is written exactly once, or nothing is (ValueError)."""
    import torch

    if state is None:
        state = read_adapter_weights(folder)
    targets = _slot_parameters(peft_model, adapter_name, state)
    with torch.no_grad():
        for key, tensor in state.items():
            targets[key].copy_(tensor)


def _slot_parameters(peft_model: Any, adapter_name: str, state: dict[str, Any]) -> dict[str, Any]:
    """The adapter's parameter for each saved key. PEFT saves `….lora_A.weight` for the
    parameter `….lora_A.<adapter>.weight` (and `….<name>` for `….<name>.<adapter>`)."""
    params = dict(adapter_parameters(peft_model, adapter_name))
    slot = set(params)
    found: dict[str, Any] = {}
    for key, tensor in state.items():
        head, _, last = key.rpartition(".")
        for name in (f"{head}.{adapter_name}.{last}", f"{key}.{adapter_name}"):
            if name in slot and params[name].shape == tensor.shape:
                found[key] = params[name]
                break
    written = {id(p) for p in found.values()}
    if len(found) != len(state) or written != {id(params[n]) for n in slot}:
        raise ValueError(
            f"the weights do not fit adapter {adapter_name!r}: {len(state)} saved tensors, "
            f"{len(found)} matched, {len(slot)} parameters in the adapter"
        )
    return found
