"""The data-parallel learner's ranks (docs/architecture/learner.md, "The learner": data-parallel).

Under `torchrun --nproc-per-node N` (or `accelerate launch`, which sets the same variables:
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) the learner is N processes. Rank 0 is
the learner the server knows: it alone attaches, claims, scores rewards, heartbeats and
publishes. Every other rank follows (learner/follower.py): it receives each session's run
config and rank 0's trainable weights and optimizer state, then each step's share of
sequences, and runs the same trainer step on it. Gradients are summed by an all-reduce.

Two process groups:
  default  (gloo on CPU, nccl on CUDA) the step's gradient all-reduce; its timeout is the
           learner's `collective_timeout_s`, shorter than the learner lease TTL
  control  (gloo, CONTROL_TIMEOUT_S) messages from rank 0 (the step's shares, pickled Python
           objects between the ranks of one job, never anything read from the bucket) and
           the metrics back; the followers wait on it between steps for as long as rank 0
           claims, scores or stands by

Rank 0's heartbeat is gated by a watchdog over the step's collectives: one that has not
returned within `collective_timeout_s` stops the heartbeat, so the lease lapses instead of
being held by a broken group. A failed collective raises; the process exits non-zero
(torchrun then stops the other ranks) and nothing more is published.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
CONTROL_TIMEOUT_S = 7 * 24 * 3600.0  # how long a follower waits for rank 0's next message


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int


class LaunchError(ValueError):
    """The launcher's variables cannot make a process group (the CLI exits 2 with it)."""


def _int_var(env: Mapping[str, str], name: str, default: str | None = None) -> int:
    value = env.get(name) or default
    if value is None:
        raise LaunchError(f"{name} is not set (WORLD_SIZE is; start the ranks with torchrun)")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name} must be a whole number (got {value!r})") from None


def rank_env(environ: Mapping[str, str] | None = None) -> RankEnv | None:
    """The launcher's rank variables, or None for a single process (no WORLD_SIZE, or 1).
    LaunchError names a variable that is missing, not a number or out of range."""
    env = os.environ if environ is None else environ
    world = _int_var(env, "WORLD_SIZE", "1")
    if world <= 1:
        return None
    rank = _int_var(env, "RANK")
    if not 0 <= rank < world:
        raise LaunchError(f"RANK {rank} is outside 0..{world - 1} (WORLD_SIZE {world})")
    local_rank = _int_var(env, "LOCAL_RANK", str(rank))
    return RankEnv(rank=rank, world_size=world, local_rank=local_rank)


def check_rendezvous(environ: Mapping[str, str] | None = None) -> None:
    """LaunchError unless the env:// rendezvous variables are set (torchrun sets them)."""
    env = os.environ if environ is None else environ
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not env.get(name):
            raise LaunchError(f"{name} is not set (WORLD_SIZE is; start the ranks with torchrun)")


class Watchdog:
    """When rank 0 is inside a step's collective, and for how long."""

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self._lock = threading.Lock()
        self._entered: tuple[str, float] | None = None

    @contextmanager
    def watch(self, what: str) -> Iterator[None]:
        with self._lock:
            self._entered = (what, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                self._entered = None

    def overdue(self) -> str | None:
        """A description of the collective that has run past the bound, or None."""
        with self._lock:
            entered = self._entered
        if entered is None:
            return None
        what, since = entered
        waited = time.monotonic() - since
        if waited <= self.bound_s:
            return None
        return f"{what} has not returned after {waited:.0f} s (bound {self.bound_s:.0f} s)"


def rank_device(device: str, local_rank: int) -> str:
    """The device of one rank: `cuda` (or `cuda:N`) becomes cuda:LOCAL_RANK; cpu stays cpu."""
    if torch.device(device).type == "cuda":
        return f"cuda:{local_rank}"
    return device


class DataParallel:
    """This process's rank in the learner's process group (see the module docstring)."""

    def __init__(
        self, env: RankEnv, *, device: str, collective_timeout_s: float, fsdp: bool = False
    ) -> None:
        self.rank, self.world_size = env.rank, env.world_size
        self.device = rank_device(device, env.local_rank)
        self.collective_timeout_s = collective_timeout_s
        self.fsdp = fsdp
        cuda = torch.device(self.device).type == "cuda"
        if cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            timeout=timedelta(seconds=collective_timeout_s),
            rank=env.rank,
            world_size=env.world_size,
        )
        self.control = dist.new_group(backend="gloo", timeout=timedelta(seconds=CONTROL_TIMEOUT_S))
        self.watchdog = Watchdog(collective_timeout_s)
        self._mesh: Any = None

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    # -- messages from rank 0 -----------------------------------------------------------------

    def scatter(self, kind: str, payloads: Sequence[Any]) -> Any:
        """Rank 0: hand rank r `payloads[r]` under `kind`; returns rank 0's own."""
        if len(payloads) != self.world_size:
            raise ValueError(f"{len(payloads)} payloads for {self.world_size} ranks")
        out: list[Any] = [None]
        with self.watchdog.watch(f"sending {kind!r} to the ranks"):
            dist.scatter_object_list(out, [(kind, p) for p in payloads], src=0, group=self.control)
        return out[0][1]

    def receive(self) -> tuple[str, Any]:
        """A follower: wait for rank 0's next message; (kind, this rank's payload)."""
        out: list[Any] = [None]
        dist.scatter_object_list(out, None, src=0, group=self.control)
        kind, payload = out[0]
        return str(kind), payload

    def broadcast(self, value: Any = None) -> Any:
        """Rank 0's `value` on every rank (pickled over the control group)."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's `value`, in rank order, on rank 0 (None on the others)."""
        out: list[Any] | None = [None] * self.world_size if self.is_leader else None
        with self.watchdog.watch("gathering the step's metrics"):
            dist.gather_object(value, out, dst=0, group=self.control)
        return out

    def stop(self, code: int) -> None:
        """Rank 0: tell the followers to exit with `code`."""
        self.scatter("stop", [code] * self.world_size)

    # -- the step's collective ----------------------------------------------------------------

    def all_reduce_sum(self, tensor: torch.Tensor) -> float:
        """Sum `tensor` over the ranks in place (default group); returns the seconds spent.
        On CUDA, NCCL's all_reduce returns once queued: the device is synchronized before
        (the backward's kernels are compute, not communication) and after, inside the
        watchdog, so the seconds and the watchdog cover the collective itself."""
        cuda = tensor.is_cuda
        if cuda:
            torch.cuda.synchronize(tensor.device)
        started = time.perf_counter()
        with self.watchdog.watch("the gradient all-reduce"):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            if cuda:
                torch.cuda.synchronize(tensor.device)
        return time.perf_counter() - started

    # -- model set-up -------------------------------------------------------------------------

    def share_trainer_state(self, trainer: Any) -> None:
        """Make every rank's trainable weights, optimizer and scheduler state and step rank 0's
        (after rank 0 loaded or resumed them). Called by every rank, once per session."""
        names = self.broadcast(list(trainer.param_names) if self.is_leader else None)
        if names != list(trainer.param_names):
            raise RuntimeError("the ranks' trainable parameters differ; same model and LoRA?")
        state = None
        if self.is_leader:
            state = {
                "weights": [p.detach().to("cpu") for p in trainer.params],
                "optimizer": _to_cpu(trainer.optimizer.state_dict()),
                "scheduler": trainer.scheduler.state_dict(),
                "step": trainer.step,
            }
        state = self.broadcast(state)
        if self.is_leader:
            return
        with torch.no_grad():
            for p, w in zip(trainer.params, state["weights"], strict=True):
                p.copy_(w.to(p.device))
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.scheduler.load_state_dict(state["scheduler"])
        trainer.step = int(state["step"])

    def shard(self, model: Any) -> None:
        """Experimental: shard the decoder layers' frozen base weights with FSDP2
        (`fully_shard` per decoder layer: all-gathered for its forward and again for its
        backward, freed after each), leaving the trainable (LoRA) parameters whole and
        replicated on every rank, so the gradient all-reduce, the optimizer, the snapshot and
        the checkpoint are unchanged. The embeddings, final norm and LM head stay whole on
        every rank (the learner's log-prob path calls the decoder and the head apart, and the
        head may share the embedding's weight). Every rank runs it, in the same order."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers.modeling_layers import GradientCheckpointingLayer

        if self._mesh is None:
            self._mesh = init_device_mesh(torch.device(self.device).type, (self.world_size,))
        for module in model.modules():
            if isinstance(module, GradientCheckpointingLayer):  # a decoder layer
                own = {p for p in module.parameters() if p.requires_grad}
                fully_shard(module, mesh=self._mesh, ignored_params=own)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value
