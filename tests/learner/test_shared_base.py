"""Several runs' adapters on one base model (learner/shared_base.py), on the real small model:
runs with their own rank, targets, seed and learning rate, trained in turns on one shared
model, end with the weights, optimizer state and checkpoints each would have had alone in a
per-run learner; a run's adapter is published and removed without touching the others; turns
are first come, first served."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from learner.checkpoint import load_state, save_state
from learner.data import Completion, Group
from learner.shared_base import SharedBase, Turns, adapter_name_of
from learner.trainer import Trainer, add_lora
from lm.adapter_io import (
    adapter_parameters,
    canonical_name,
    load_adapter_version,
    save_adapter_version,
    snapshot_adapter,
)
from protocol.run_config import RunConfig
from tests.harness.runs import run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _config(seed: int, rank: int, targets: list[str], lr: float, **grpo: Any) -> RunConfig:
    return RunConfig.model_validate(
        run_config(
            name=f"run-{seed}",
            seed=seed,
            group_size=2,
            lora={"rank": rank, "alpha": 2 * rank, "target_modules": targets},
            grpo={"learning_rate": lr, "micro_batch_tokens": 64, **grpo},
        )
    )


RUNS = {
    "11111111-1111-4111-8111-111111111111": _config(1, 4, ["q_proj", "v_proj"], 1e-3),
    "22222222-2222-4222-8222-222222222222": _config(
        2, 8, ["q_proj", "k_proj", "o_proj"], 5e-3, gradient_checkpointing=True
    ),
}


def _groups(seed: int) -> list[Group]:
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for prompt_len, lengths in ((3, (4, 7)), (5, (2, 6))):
        prompt = torch.randint(10, 4000, (prompt_len,), generator=gen).tolist()
        completions = []
        for n in lengths:
            ids = torch.randint(10, 4000, (n,), generator=gen).tolist()
            behaviour = (-torch.rand(n, generator=gen) - 4).tolist()
            completions.append(Completion(prompt, ids, behaviour))
        groups.append(Group(completions, [1.0, 0.0]))
    return groups


def _alone(small_model: Any, config: RunConfig, steps: list[int]) -> Trainer:
    trainer = Trainer(add_lora(copy.deepcopy(small_model), config), config, pad_id=0)
    for seed in steps:
        trainer.train_step(_groups(seed))
    return trainer


@pytest.fixture(scope="module")
def shared(small_model: Any) -> SharedBase:
    base = SharedBase("unused: the base is given", dtype="float32", device="cpu")
    base._base = copy.deepcopy(small_model)
    return base


def _trainer(shared: SharedBase, run_id: str) -> Trainer:
    name = adapter_name_of(run_id)
    with shared.turn():
        model = shared.add(name, RUNS[run_id], None)
        return Trainer(model, RUNS[run_id], pad_id=0, adapter_name=name)


def test_runs_trained_in_turns_end_as_each_would_alone(
    shared: SharedBase, small_model: Any, tmp_path: Path
) -> None:
    a, b = RUNS
    trainers = {run_id: _trainer(shared, run_id) for run_id in RUNS}
    order = [(a, 1), (b, 2), (b, 3), (a, 4), (b, 5), (a, 6)]
    for run_id, seed in order:
        with shared.turn():
            trainers[run_id].activate()
            trainers[run_id].train_step(_groups(seed))
    for run_id, trainer in trainers.items():
        alone = _alone(small_model, RUNS[run_id], [s for r, s in order if r == run_id])
        assert trainer.param_names == alone.param_names  # checkpoints name them alike
        for mine, theirs in zip(trainer.params, alone.params, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
        ours, solo = trainer.optimizer.state_dict(), alone.optimizer.state_dict()
        for index, state in solo["state"].items():
            torch.testing.assert_close(ours["state"][index]["exp_avg"], state["exp_avg"])
        # the pool's checkpoint resumes a per-run learner and the other way round
        folder = tmp_path / run_id
        save_state(folder, names=trainer.param_names, optimizer=trainer.optimizer,
                   scheduler=trainer.scheduler, step=trainer.step, version=3)  # fmt: skip
        fresh = Trainer(add_lora(copy.deepcopy(small_model), RUNS[run_id]), RUNS[run_id], pad_id=0)
        load_state(folder, names=fresh.param_names, optimizer=fresh.optimizer,
                   scheduler=fresh.scheduler)  # fmt: skip
        assert fresh.optimizer.state_dict()["state"].keys() == solo["state"].keys()


def test_a_published_adapter_is_the_runs_own_and_its_removal_leaves_the_others(
    shared: SharedBase, small_model: Any, tmp_path: Path
) -> None:
    a, b = RUNS
    trainers = {run_id: _trainer(shared, run_id) for run_id in RUNS}
    for trainer in trainers.values():
        with shared.turn():
            trainer.activate()
            trainer.train_step(_groups(7))
    name_b = adapter_name_of(b)
    weights = snapshot_adapter(shared.model, name_b)
    assert weights and all(f".{name_b}." in k for k in weights)
    out = tmp_path / "v1"
    save_adapter_version(shared.model, out, state_dict=weights, adapter_name=name_b)
    # the folder is a per-run learner's: it loads as PEFT's default adapter with b's weights
    loaded = load_adapter_version(copy.deepcopy(small_model), out)
    own = {canonical_name(k, name_b): v for k, v in weights.items()}
    for key, param in adapter_parameters(loaded):
        torch.testing.assert_close(param.detach(), own[key], rtol=0, atol=0)
    before_a = [p.detach().clone() for p in trainers[a].params]
    with shared.turn():
        shared.remove(name_b)
    assert shared.adapters == {adapter_name_of(a)}
    assert not adapter_parameters(shared.model, name_b)
    with shared.turn():
        trainers[a].activate()
        trainers[a].train_step(_groups(8))
    assert any(not torch.equal(x, p) for x, p in zip(before_a, trainers[a].params, strict=True))
    with pytest.raises(KeyError, match="no adapter"):
        trainers[b].activate()


def test_turns_are_first_come_first_served() -> None:
    turns = Turns()
    served: list[int] = []
    asked: list[int] = []
    started = threading.Event()

    def holder() -> None:
        with turns:
            started.set()
            while len(asked) < 3 or turns.waiting < 4:
                time.sleep(0.001)

    def waiter(n: int) -> None:
        while turns.waiting != n + 1:  # ask after the ones before it, in this order
            time.sleep(0.001)
        asked.append(n)
        with turns:
            served.append(n)

    threads = [threading.Thread(target=holder)] + [
        threading.Thread(target=waiter, args=(n,)) for n in range(3)
    ]
    threads[0].start()
    assert started.wait(10)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(10)
    assert served == [0, 1, 2]
