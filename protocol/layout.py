"""Bucket key layout (docs/architecture/bucket.md, "Bucket layout and batch format"): pure
functions, the one place keys are built.

runs/{run_id}/adapters/v{version:06d}/{file}
runs/{run_id}/checkpoints/v{version:06d}/{file}
runs/{run_id}/batches/{lease_id}-{fencing}.parquet
datasets/{dataset_id}/data.{jsonl|parquet}
probes/{made_ms}-{random hex}   (a bucket probe of `asyncgrpo doctor`, deleted within minutes)
"""

from __future__ import annotations

import re
import uuid

# \A…\Z, not ^…$ (`$` also matches before a trailing newline); ASCII digits only.
_FILE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,199}\Z")
_PROBE_ID = re.compile(r"\A(?P<made_ms>[0-9]{13})-[0-9a-f]{32}\Z")
PROBES_PREFIX = "probes/"
_BATCH_KEY = re.compile(
    r"\Aruns/(?P<run>[0-9a-f-]{36})/batches/(?P<lease>[0-9a-f-]{36})-(?P<fencing>[0-9]+)\.parquet\Z"
)


def _check_file(name: str) -> str:
    """A single path component: no slashes, no '..', no leading dot."""
    if not _FILE_NAME.match(name) or ".." in name:
        raise ValueError(f"invalid file name {name!r}")
    return name


def _check_version(version: int) -> int:
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return version


def run_prefix(run_id: uuid.UUID | str) -> str:
    return f"runs/{uuid.UUID(str(run_id))}/"


def adapter_prefix(run_id: uuid.UUID | str, version: int) -> str:
    return f"{run_prefix(run_id)}adapters/v{_check_version(version):06d}/"


def adapter_key(run_id: uuid.UUID | str, version: int, file: str) -> str:
    return adapter_prefix(run_id, version) + _check_file(file)


def checkpoint_prefix(run_id: uuid.UUID | str, version: int) -> str:
    return f"{run_prefix(run_id)}checkpoints/v{_check_version(version):06d}/"


def checkpoint_key(run_id: uuid.UUID | str, version: int, file: str) -> str:
    return checkpoint_prefix(run_id, version) + _check_file(file)


def batches_prefix(run_id: uuid.UUID | str) -> str:
    return f"{run_prefix(run_id)}batches/"


def batch_key(run_id: uuid.UUID | str, lease_id: uuid.UUID | str, fencing: int) -> str:
    if fencing < 0:
        raise ValueError(f"fencing must be >= 0, got {fencing}")
    return f"{batches_prefix(run_id)}{uuid.UUID(str(lease_id))}-{fencing}.parquet"


def parse_batch_key(key: str) -> tuple[uuid.UUID, uuid.UUID, int]:
    """(run_id, lease_id, fencing) of a batch key; ValueError if it is not one."""
    match = _BATCH_KEY.match(key)
    if match is None:
        raise ValueError(f"not a batch key: {key!r}")
    return uuid.UUID(match["run"]), uuid.UUID(match["lease"]), int(match["fencing"])


DATASET_FORMATS = ("jsonl", "parquet")


def dataset_key(dataset_id: uuid.UUID | str, fmt: str) -> str:
    """Where a stored dataset's file lives (uploaded as is, or a Hugging Face one as Parquet)."""
    if fmt not in DATASET_FORMATS:
        raise ValueError(f"dataset format must be one of {', '.join(DATASET_FORMATS)}")
    return f"datasets/{uuid.UUID(str(dataset_id))}/data.{fmt}"


def probe_key(probe_id: str) -> str:
    """Where a bucket probe's object lives; ValueError unless `probe_id` is one (the time it
    was made, in ms since the epoch, then 32 random hex digits)."""
    if not isinstance(probe_id, str) or _PROBE_ID.match(probe_id) is None:
        raise ValueError(f"not a bucket probe id: {probe_id!r}")
    return PROBES_PREFIX + probe_id


def probe_made_ms(key: str) -> int | None:
    """When the probe at `key` was made (ms since the epoch); None if `key` is not a probe's."""
    if not key.startswith(PROBES_PREFIX):
        return None
    match = _PROBE_ID.match(key.removeprefix(PROBES_PREFIX))
    return None if match is None else int(match["made_ms"])
