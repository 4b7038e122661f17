"""One base model for the runs a pool learner holds (docs/architecture/learner.md, "Many runs
on one base model"): its weights are loaded once, each run's LoRA adapter is a named adapter
of one PEFT model, and the runs take turns on it.

The scheduling rule: a run's step, spot check, snapshot or adapter change waits for its turn,
and turns are granted first come, first served (`Turns`). The model is never idle while a
run's step is ready, and a ready run waits at most one turn of each other run held."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from protocol.run_config import RunConfig

log = logging.getLogger(__name__)


class Turns:
    """A first-come, first-served lock: each `with turns:` waits for the turns asked before
    it (a ticket each), so no waiting run is overtaken. Not re-entrant."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._changed:
            ticket = self._next_ticket
            self._next_ticket += 1
            while ticket != self._serving:
                self._changed.wait()

    def __exit__(self, *_: object) -> None:
        with self._changed:
            self._serving += 1
            self._changed.notify_all()

    @property
    def waiting(self) -> int:
        """Turns asked and not yet ended (the one running included)."""
        with self._changed:
            return self._next_ticket - self._serving


def adapter_name_of(run_id: str) -> str:
    """A run's adapter name in the shared model (a PEFT module key: no dots)."""
    return "run_" + run_id.replace("-", "")


class SharedBase:
    """The pool learner's one base model (loaded at the first run's attach) and its runs'
    adapters. Everything that reads or changes the model runs inside `turn`."""

    def __init__(self, model_name: str, *, dtype: str, device: str) -> None:
        self.model_name = model_name
        self.dtype = dtype
        self.device = device
        self.turns = Turns()
        self.model: Any = None  # the PEFT model once the first adapter is added
        self._base: Any = None
        self._adapters: set[str] = set()

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self.turns:
            yield

    def _loaded_base(self) -> Any:
        if self.model is not None:
            return self.model
        if self._base is None:
            import torch

            from lm.models import load_model

            self._base = load_model(
                self.model_name, dtype=getattr(torch, self.dtype), device=self.device
            )
            log.info("loaded the base model %s once for every run held", self.model_name)
        return self._base

    def add(self, adapter_name: str, config: RunConfig, resume: Path | None) -> Any:
        """Add a run's adapter: fresh from its seed, or the version folder `resume`; returns
        the shared PEFT model. Call inside a turn."""
        from learner.trainer import add_lora
        from lm.adapter_io import load_adapter_version

        if adapter_name in self._adapters:
            self.remove(adapter_name)  # a re-attach of the same run builds it again
        base = self._loaded_base()
        if resume is not None:
            self.model = load_adapter_version(
                base, resume, is_trainable=True, adapter_name=adapter_name
            )
        else:
            self.model = add_lora(base, config, adapter_name)
        self._adapters.add(adapter_name)
        return self.model

    def remove(self, adapter_name: str) -> None:
        """Drop a run's adapter (its LoRA modules and their memory). Call inside a turn."""
        if adapter_name not in self._adapters:
            return
        self._adapters.discard(adapter_name)
        self.model.delete_adapter(adapter_name)
        import gc

        gc.collect()

    @property
    def adapters(self) -> set[str]:
        return set(self._adapters)
