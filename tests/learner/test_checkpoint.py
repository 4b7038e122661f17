"""Resume state round trip: save, load into fresh objects, the next step is identical."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from learner.checkpoint import load_state, save_state


def _setup(
    seed: int,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def _step(model, opt, sched) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(5, 4)  # uses the torch RNG, so the restored RNG matters
    loss = model(x).pow(2).mean() + random.random()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()


def test_save_load_gives_an_identical_next_step(tmp_path: Path) -> None:
    model, opt, sched = _setup(0)
    names = [n for n, _ in model.named_parameters()]
    for _ in range(3):
        _step(model, opt, sched)
    save_state(tmp_path, names=names, optimizer=opt, scheduler=sched, step=3, version=2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    _step(model, opt, sched)
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    model2, opt2, sched2 = _setup(1)  # different init and RNG
    model2.load_state_dict(weights)
    state = load_state(tmp_path, names=names, optimizer=opt2, scheduler=sched2)
    assert state["step"] == 3 and state["version"] == 2
    assert sched2.last_epoch == sched.last_epoch - 1
    _step(model2, opt2, sched2)
    for k, v in model2.state_dict().items():
        torch.testing.assert_close(v, expected[k], rtol=0, atol=0)
    assert not any(p.suffix in (".pt", ".bin", ".pkl") for p in tmp_path.iterdir())


def test_a_captured_state_is_the_state_of_its_moment(tmp_path: Path) -> None:
    """capture_state copies; write_state later (the background publish) writes what was
    captured, not what the optimizer holds by then."""
    from learner.checkpoint import capture_state, write_state

    model, opt, sched = _setup(0)
    names = [n for n, _ in model.named_parameters()]
    _step(model, opt, sched)
    save_state(tmp_path / "now", names=names, optimizer=opt, scheduler=sched, step=1, version=1)
    captured = capture_state(names=names, optimizer=opt, scheduler=sched, step=1, version=1)
    _step(model, opt, sched)
    write_state(tmp_path / "later", captured)
    for name in ("optimizer.safetensors", "trainer_state.json"):
        assert (tmp_path / "later" / name).read_bytes() == (tmp_path / "now" / name).read_bytes()
    save_state(tmp_path / "moved", names=names, optimizer=opt, scheduler=sched, step=2, version=2)
    moved = (tmp_path / "moved" / "optimizer.safetensors").read_bytes()
    assert moved != (tmp_path / "now" / "optimizer.safetensors").read_bytes()
