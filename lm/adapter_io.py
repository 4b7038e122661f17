"""Adapter version folders: PEFT's adapter_model.safetensors + adapter_config.json, nothing else.

A version folder loads unchanged with `PeftModel.from_pretrained` and vLLM's `LoRARequest`.
Uploading it (conditional puts, `If-None-Match: *`) is the learner's job; this module writes and
reads the local folder and computes its manifest (protocol.adapters).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from protocol.adapters import REQUIRED_FILES, AdapterManifest, manifest_of, verify_folder


def save_adapter_version(peft_model: Any, out_dir: Path) -> AdapterManifest:
    """Write the model's active LoRA adapter as a version folder; return its manifest.

    `out_dir` must not exist yet (versions are immutable); it is filled through a temporary
    folder and renamed into place.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; adapter versions are immutable")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=out_dir.name + ".tmp-") as tmp:
        raw = Path(tmp) / "peft"
        peft_model.save_pretrained(str(raw), safe_serialization=True)
        staged = Path(tmp) / "version"
        staged.mkdir()
        for name in REQUIRED_FILES:
            shutil.move(str(raw / name), staged / name)
        staged.chmod(0o755)
        staged.rename(out_dir)
    return manifest_of(out_dir)


def load_adapter_version(
    base_model: Any,
    folder: Path,
    *,
    manifest: AdapterManifest | None = None,
    is_trainable: bool = False,
) -> Any:
    """Wrap `base_model` (modified in place, as PEFT does) with a version folder's adapter.

    With a manifest, the files are verified first (sha256 and size; AdapterMismatch otherwise).
    """
    from peft import PeftModel

    if manifest is not None:
        verify_folder(Path(folder), manifest)
    model = PeftModel.from_pretrained(base_model, str(folder), is_trainable=is_trainable)
    if not is_trainable:
        model.eval()
    return model
