"""An engine's tokens/s alone: lease-sized calls (1 prompt × G 16, 64 new tokens) back to back
from enough threads to keep `--concurrency` sequences in flight, with no control plane. The
baseline of bench/worker_pipeline.py, which runs it in .venv-vllm for the vllm backend (so this
module imports nothing of the server's stack).

    .venv-vllm/bin/python bench/engine_alone.py --backend vllm --concurrency 64 --json
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402

GROUP_SIZE = 16
MAX_NEW_TOKENS = 64


def make_backend(name: str, concurrency: int) -> Any:
    from worker.config import WorkerSettings
    from worker.main import make_backend as worker_backend

    settings = WorkerSettings(
        server_url="http://unused",
        backend=name,  # type: ignore[arg-type]
        num_threads=1,
        max_batch_sequences=max(concurrency, GROUP_SIZE),
    )
    return worker_backend(settings)


def tokens_per_s(backend_name: str, concurrency: int, seconds: float) -> float:
    """Lease-sized calls back to back from `concurrency / 16` threads, no control plane."""
    from lm.chat import encode_prompt
    from worker.backends.base import SamplingSpec

    backend = make_backend(backend_name, concurrency)
    try:
        prompts = [
            encode_prompt(backend.tokenizer, f"What is {i} + {i + 7}?", None) for i in range(997)
        ]
        tokens = [0]
        lock = threading.Lock()
        deadline = time.monotonic() + seconds

        def caller(index: int) -> None:
            n = index
            while time.monotonic() < deadline:
                spec = SamplingSpec(1.0, MAX_NEW_TOKENS, seed=n)
                out = backend.generate([prompts[n % len(prompts)]], GROUP_SIZE, spec, None)
                with lock:
                    tokens[0] += sum(len(c.token_ids) for c in out)
                n += 1000

        started = time.monotonic()
        threads = [
            threading.Thread(target=caller, args=(i,), daemon=True)
            for i in range(max(1, concurrency // GROUP_SIZE))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return tokens[0] / (time.monotonic() - started)
    finally:
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="simulated", help="simulated, transformers or vllm")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    report.add_json_flag(parser)
    args = parser.parse_args()
    figure = tokens_per_s(args.backend, args.concurrency, args.seconds)
    print(f"{args.backend} alone at {args.concurrency} sequences: {figure:.0f} tokens/s")
    report.emit(args, {"engine_tokens_per_s": figure})


if __name__ == "__main__":
    main()
