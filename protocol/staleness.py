"""Staleness: the one definition of how far a batch lags and when it has left the window
(docs/architecture/lease-engine.md, "Units of work" and invariant 5).

The functions are plain arithmetic, so they take ints or SQL column expressions alike: the
learner's claim calls them on ints, and the heartbeat's statement is built from the same
expression (server/leases/train.py abort_reason)."""

from __future__ import annotations

from typing import Any


def staleness(current_version: Any, adapter_version: Any) -> Any:
    """Versions published since the batch's adapter version: the run's current version minus
    the version the batch was generated with."""
    return current_version - adapter_version


def outside_window(current_version: Any, adapter_version: Any, max_staleness: Any) -> Any:
    """A batch of this adapter version can no longer be trained on: its staleness is above
    the run's max_staleness."""
    return staleness(current_version, adapter_version) > max_staleness


def trained_on(target_version: Any) -> Any:
    """The version a batch trained into `target_version` is trained on top of: the learner
    publishes target_version from target_version − 1, so the claim measures the window (and
    records the staleness) against it. With target = current + 1 this is the current version."""
    return target_version - 1
