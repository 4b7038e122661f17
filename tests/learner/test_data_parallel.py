"""The data-parallel learner step (learner/distributed.py, docs/architecture/learner.md, "The
learner"): two ranks over gloo end with the parameters one process reaches on the same groups, for
every loss type, with the skipped group's completions left out before the split and the ranks padded
to the same number of micro-steps; FSDP2-sharded base weights too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from learner.data import plan_step, split_shares
from learner.trainer import Trainer
from tests.learner import dp_ranks
from tests.s3_fixtures import free_port

pytestmark = pytest.mark.timeout(300)


def _spawn(out: Path, fsdp: bool) -> Path:
    mp.spawn(dp_ranks.rank_main, args=(2, free_port(), str(out), fsdp), nprocs=2, join=True)
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _spawn(tmp_path_factory.mktemp("dp"), fsdp=False)


@pytest.fixture(scope="module")
def two_ranks_fsdp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _spawn(tmp_path_factory.mktemp("fsdp"), fsdp=True)


def _one_process(
    grpo: dict[str, Any],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[dict[str, float]]]:
    config = dp_ranks.run_config(grpo)
    model = dp_ranks.tiny_model(lora_seed=0, config=config)
    start = dp_ranks.trainable(model)
    trainer = Trainer(model, config, pad_id=0)
    metrics = [trainer.train_step(groups) for groups in dp_ranks.steps()]
    return start, dp_ranks.trainable(model), metrics


def _check(out: Path, name: str, grpo: dict[str, Any]) -> list[dict[str, Any]]:
    start, want, single = _one_process(grpo)
    for rank in (0, 1):
        got = torch.load(out / f"{name}-rank{rank}.pt")
        assert got.keys() == want.keys()
        for key in want:
            torch.testing.assert_close(
                got[key], want[key], rtol=1e-4, atol=1e-6, msg=f"{name} rank {rank} {key}"
            )
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    assert moved > 1e-3  # the steps changed the weights: the equality is not trivial
    figures = json.loads((out / f"{name}.json").read_text())
    for step, one in zip(figures, single, strict=True):
        m = step["metrics"]
        assert m["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-7)
        assert m["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
        assert m["trained_tokens"] == one["trained_tokens"]
        assert m["ranks"] == 2.0
        assert all(r["tokens"] > 0 for r in step["runs"])  # both ranks trained a share
        micro = {r["micro"] + r["empty"] for r in step["runs"]}
        assert len(micro) == 1  # the same number of micro-steps on every rank
    return figures


@pytest.mark.parametrize("name", list(dp_ranks.CASES))
def test_two_ranks_equal_one_process(two_ranks: Path, name: str) -> None:
    figures = _check(two_ranks, name, dp_ranks.CASES[name])
    if dp_ranks.CASES[name].get("beta", 0.0) == 0.0:  # g2 (equal rewards) skipped before the split
        assert all(f["metrics"]["zero_advantage_fraction"] == 0.2 for f in figures)
        assert sum(r["tokens"] for r in figures[0]["runs"]) == sum(
            len(c.completion_ids)
            for i, g in enumerate(dp_ranks.steps()[0])
            if i != 2
            for c in g.completions
        )


def test_some_step_pads_a_rank_with_empty_micro_steps(two_ranks: Path) -> None:
    figures = json.loads((two_ranks / "dapo.json").read_text())
    assert any(r["empty"] > 0 for f in figures for r in f["runs"])


@pytest.mark.parametrize("name", list(dp_ranks.FSDP_CASES))
def test_fsdp2_sharded_base_equals_one_process(two_ranks_fsdp: Path, name: str) -> None:
    figures = _check(two_ranks_fsdp, name, dp_ranks.FSDP_CASES[name])
    assert figures[0]["sharded"] == 0.5  # rank 0 holds half of each decoder layer's weights


def test_split_shares_balances_and_keeps_every_sequence() -> None:
    groups = dp_ranks.steps()[0]
    plan = plan_step(
        groups,
        loss_type="dapo",
        scale_rewards="group",
        max_completion_tokens=8,
        skip_zero_advantage=True,
    )
    shares = split_shares(plan, 3, 24)
    ids = sorted(id(s) for share in shares for s in share.sequences)
    assert ids == sorted(id(s) for s in plan.sequences)  # each trained sequence exactly once
    assert len(plan.sequences) == 8  # the equal-reward group's two are not among them
    assert {share.micro_steps for share in shares} == {max(share.micro_steps for share in shares)}
    assert all(share.normaliser == plan.normaliser for share in shares)
    loads = [
        sum(
            len(s.completion.prompt_ids) + len(s.completion.completion_ids) for s in share.sequences
        )
        for share in shares
    ]
    assert max(loads) - min(loads) <= 10  # longest first to the least loaded: 66 positions
    assert split_shares(plan, 3, 24) == shares  # deterministic


def test_rank_variables_and_devices() -> None:
    from learner.distributed import (
        LaunchError,
        RankEnv,
        check_rendezvous,
        rank_device,
        rank_env,
    )

    assert rank_env({}) is None and rank_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}
    assert rank_env(env) == RankEnv(rank=3, world_size=4, local_rank=1)
    assert rank_env({"WORLD_SIZE": "2", "RANK": "1"}) == RankEnv(1, 2, 1)
    assert rank_env({"WORLD_SIZE": "", "RANK": "0"}) is None
    for bad, named in (({"WORLD_SIZE": "2"}, "RANK"), ({"WORLD_SIZE": "2", "RANK": "2"}, "0..1")):
        with pytest.raises(LaunchError, match=named):
            rank_env(bad)
    with pytest.raises(LaunchError, match="MASTER_PORT"):
        check_rendezvous({"MASTER_ADDR": "127.0.0.1"})
    assert rank_device("cuda", 3) == "cuda:3" and rank_device("cuda:0", 2) == "cuda:2"
    assert rank_device("cpu", 1) == "cpu"
