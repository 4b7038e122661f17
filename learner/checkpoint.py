"""Resume state of the learner, written beside each published adapter version.

Files (no pickle anywhere; the bucket is readable by others, so nothing read back from it is
unpickled):
    optimizer.safetensors   AdamW moments per trainable parameter (by name) + the RNG state
    trainer_state.json      step, version, optimizer param-group hyper-parameters, per-parameter
                            AdamW step counts, scheduler state, Python RNG state
The adapter weights themselves are the version's PEFT files (lm/adapter_io).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
STATE_FORMAT = 1


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot store {type(value).__name__} in the trainer state")


@dataclass(frozen=True)
class CapturedState:
    """The resume state copied at one moment (tensors on the CPU), written later, possibly
    from another thread while training goes on."""

    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]


def capture_state(
    *,
    names: Sequence[str],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    step: int,
    version: int,
) -> CapturedState:
    """Copy the optimizer, scheduler, RNG and step. `names[i]` names the i-th parameter of the
    optimizer's (single) param group."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {"rng.torch": torch.get_rng_state()}
    steps: dict[str, float] = {}
    for index, state in sd["state"].items():
        name = names[index]
        for key, value in state.items():
            if key == "step":
                steps[name] = float(value)
            else:
                tensors[f"opt.{name}.{key}"] = value.detach().to("cpu", copy=True).contiguous()
    groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    sched = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    state = {
        "format": STATE_FORMAT,
        "step": step,
        "version": version,
        "param_names": list(names),
        "param_groups": _jsonable(groups),
        "adam_steps": steps,
        "scheduler": _jsonable(sched),
        "python_rng": _jsonable(random.getstate()),
    }
    return CapturedState(tensors, state)


def write_state(folder: Path, captured: CapturedState) -> list[Path]:
    """Write a captured state's two files into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(captured.tensors, str(folder / OPTIMIZER_FILE))
    (folder / STATE_FILE).write_text(json.dumps(captured.state, sort_keys=True))
    return [folder / OPTIMIZER_FILE, folder / STATE_FILE]


def save_state(
    folder: Path,
    *,
    names: Sequence[str],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    step: int,
    version: int,
) -> list[Path]:
    """Capture and write at once."""
    captured = capture_state(
        names=names, optimizer=optimizer, scheduler=scheduler, step=step, version=version
    )
    return write_state(folder, captured)


def load_state(
    folder: Path,
    *,
    names: Sequence[str],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Restore what `save_state` wrote (safetensors + JSON only); returns the JSON state
    (`step`, `version`, ...). Raises ValueError when it does not fit these parameters."""
    state = json.loads((folder / STATE_FILE).read_text())
    if state.get("format") != STATE_FORMAT or state.get("param_names") != list(names):
        raise ValueError("checkpoint does not match the trainable parameters")
    tensors = load_file(str(folder / OPTIMIZER_FILE))
    sd = optimizer.state_dict()
    new_state: dict[int, dict[str, Any]] = {}
    for index, name in enumerate(names):
        if name not in state["adam_steps"]:
            continue
        entry: dict[str, Any] = {"step": torch.tensor(state["adam_steps"][name])}
        prefix = f"opt.{name}."
        for key, value in tensors.items():
            if key.startswith(prefix):
                entry[key[len(prefix) :]] = value
        new_state[index] = entry
    groups = []
    for group, saved in zip(sd["param_groups"], state["param_groups"], strict=True):
        restored = {**group, **saved}
        if "betas" in restored:
            restored["betas"] = tuple(restored["betas"])
        groups.append(restored)
    optimizer.load_state_dict({"state": new_state, "param_groups": groups})
    scheduler.load_state_dict({**scheduler.state_dict(), **state["scheduler"]})
    torch.set_rng_state(tensors["rng.torch"])
    version_, internal, gauss = state["python_rng"]
    random.setstate((version_, tuple(internal), gauss))
    return dict(state)
