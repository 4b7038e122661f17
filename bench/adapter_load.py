"""How long the transformers worker takes to make a new adapter version ready, against the copy
of its bytes: building a new PEFT adapter for it (what each version cost before) versus writing
its weights into a slot of the same shape that already exists (the backend's way now).

    .venv/bin/python bench/adapter_load.py [--ranks 8 64 128] [--repeats 5] [--json]

The small model (SmolLM2-135M, fp32 on CPU) with LoRA on q,k,v,o,gate,up,down at each rank;
two versions of random weights per rank. Per rank, medians over `--repeats` of: `build`
(delete the old adapter, `load_adapter` the new version: PEFT creates the modules and loads the
file), `write` (lm.adapter_io.write_adapter_weights into the existing adapter) and `copy` (the
floor: read the file and copy each tensor into memory already allocated). Ratios: build / write
and write / copy.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import report  # noqa: E402

MODEL = "smollm2-135m-instruct"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _versions(base: Any, rank: int, root: Path) -> list[Path]:
    import torch
    from peft import LoraConfig, get_peft_model

    from lm.adapter_io import save_adapter_version

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                        init_lora_weights=False, target_modules=TARGETS)  # fmt: skip
    folders = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        folder = root / f"r{rank}-v{seed}"
        save_adapter_version(get_peft_model(copy.deepcopy(base), config), folder)
        folders.append(folder)
    return folders


def _timed(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(base: Any, rank: int, root: Path, repeats: int) -> dict[str, float]:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    from lm.adapter_io import write_adapter_weights
    from protocol.adapters import ADAPTER_WEIGHTS

    v1, v2 = _versions(base, rank, root)
    peft = PeftModel.from_pretrained(copy.deepcopy(base), str(v1), adapter_name="a0")
    current = ["a0"]

    def build() -> None:
        """What a new version cost before: a new adapter built, the old one deleted."""
        new = f"a{len(current)}"
        peft.load_adapter(str(v2), adapter_name=new)
        peft.set_adapter(new)
        peft.delete_adapter(current[-1])
        current.append(new)

    build_s = _timed(build, repeats)
    write_s = _timed(lambda: write_adapter_weights(peft, v2, current[-1]), repeats)
    targets = {k: torch.empty_like(v) for k, v in load_file(str(v2 / ADAPTER_WEIGHTS)).items()}

    def copy_bytes() -> None:
        """The floor: read the file and copy every tensor into memory already allocated."""
        for key, tensor in load_file(str(v2 / ADAPTER_WEIGHTS)).items():
            targets[key].copy_(tensor)

    copy_s = _timed(copy_bytes, repeats)
    size = (v2 / ADAPTER_WEIGHTS).stat().st_size
    return {"rank": rank, "mb": size / 1e6, "build_s": build_s, "write_s": write_s,
            "copy_s": copy_s, "build_over_write": build_s / write_s,
            "write_over_copy": write_s / copy_s}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 128])
    parser.add_argument("--repeats", type=int, default=5)
    report.add_json_flag(parser)
    args = parser.parse_args()
    import torch

    from lm.models import load_model

    torch.set_num_threads(1)
    base = load_model(MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(base, rank, Path(tmp), args.repeats) for rank in args.ranks]
    print(f"bench/adapter_load.py: medians of {args.repeats}, {MODEL} fp32 on CPU, LoRA on "
          f"{len(TARGETS)} modules")  # fmt: skip
    print(f"{'rank':>5} {'MB':>7} {'build s':>8} {'write s':>8} {'copy s':>7} "
          f"{'build/write':>11} {'write/copy':>10}")  # fmt: skip
    for r in rows:
        print(
            f"{r['rank']:>5} {r['mb']:>7.1f} {r['build_s']:>8.3f} {r['write_s']:>8.3f} "
            f"{r['copy_s']:>7.3f} {r['build_over_write']:>11.1f} {r['write_over_copy']:>10.2f}"
        )
    report.emit(args, {"ranks": {str(r["rank"]): r for r in rows}})


if __name__ == "__main__":
    main()
