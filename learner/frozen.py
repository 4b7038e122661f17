"""Frozen copies of the adapter weights of recent versions, for spot-checks
(docs/architecture/learner.md, "The learner"): a batch is re-scored with the weights of the version
it claims, not with the weights being trained.

A copy is taken when a version is handed to the publisher (the very tensors published) and
kept while batches of that version can still be claimed: a batch of version a can be trained
into version T only while (T - 1) - a ≤ max_staleness, and T is above the last published
version, so versions older than published - max_staleness are dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


class FrozenWeights:
    """Version → CPU copy of the trainable parameters; version 0 is the adapter disabled."""

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self._by_version: dict[int, dict[str, torch.Tensor]] = {}

    def keep(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        self._by_version[version] = weights

    def prune(self, published_version: int) -> None:
        floor = published_version - self.max_staleness
        for version in [v for v in self._by_version if v < floor]:
            del self._by_version[version]

    def has(self, version: int) -> bool:
        return version == 0 or version in self._by_version

    @property
    def versions(self) -> list[int]:
        return sorted(self._by_version)

    @contextmanager
    def scoring_with(self, model: Any, version: int) -> Iterator[bool]:
        """Within the block the model computes with `version`'s weights (yields whether the
        adapter is in use: False for version 0). The trained weights are put back after.
        Only between optimizer steps, on the thread that trains."""
        if version == 0:
            with model.disable_adapter():
                yield False
            return
        frozen = self._by_version[version]
        params = dict(model.named_parameters())
        with torch.no_grad():
            trained = {name: params[name].detach().clone() for name in frozen}
            for name, tensor in frozen.items():
                params[name].copy_(tensor)
        try:
            yield True
        finally:
            with torch.no_grad():
                for name, tensor in trained.items():
                    params[name].copy_(tensor)
