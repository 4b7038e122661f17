"""bench/learner.py --ranks: the data-parallel step over 1 and 2 gloo ranks, one tiny run
(the real small model, two completions of at most 8 tokens), and its command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.learner import _without_ranks
from bench.learner_ranks import _command

ROOT = Path(__file__).resolve().parents[2]


def test_the_rank_children_get_the_options_without_ranks_and_json() -> None:
    argv = ["--prompts", "2", "--ranks", "1", "2", "--threads", "1", "--json"]
    assert _without_ranks(argv) == ["--prompts", "2", "--threads", "1"]
    two = _command(2, ["--prompts", "2"])
    assert two[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert two[6] == "--" and two[-2:] == ["--rank-child", "--json"]
    assert _command(1, [])[1].endswith("bench/learner.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_and_two_ranks_report_the_communication_share_and_tokens_per_rank() -> None:
    argv = [
        sys.executable,
        "bench/learner.py",
        *["--ranks", "1", "2", "--prompts", "2", "--group", "2", "--tokens", "8"],
        *["--median", "4", "--prompt-tokens", "8", "--repeats", "1", "--warmup", "0"],
        *["--threads", "1", "--json"],
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert "CPU" in figures["label"] and figures["threads_per_rank"] == 1
    one, two = figures["runs"]
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert one["comm_fraction"] == 0.0 and one["allreduce_bytes"] == 0
    assert two["trained_tokens"] == one["trained_tokens"]  # the same step, split in two
    assert len(two["per_rank"]) == 2
    for rank in two["per_rank"]:
        assert 0.0 < rank["comm_fraction"] < 1.0
        assert rank["allreduce_s"] > 0 and rank["tokens_per_s"] > 0
    assert two["allreduce_bytes"] > 4  # every LoRA gradient and the loss
    assert "no speed-up can show" in done.stdout
