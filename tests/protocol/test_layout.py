"""Bucket key layout: the keys docs/architecture/bucket.md, "Bucket layout and batch format", names,
and refusal of anything that could escape them."""

from __future__ import annotations

import uuid

import pytest

from protocol import layout

RUN = uuid.UUID("12345678-1234-5678-1234-567812345678")
LEASE = uuid.UUID("87654321-4321-8765-4321-876543218765")


def test_keys_follow_the_documented_layout() -> None:
    assert (
        layout.adapter_key(RUN, 3, "adapter_model.safetensors")
        == f"runs/{RUN}/adapters/v000003/adapter_model.safetensors"
    )
    assert layout.checkpoint_key(RUN, 12, "optimizer.safetensors") == (
        f"runs/{RUN}/checkpoints/v000012/optimizer.safetensors"
    )
    assert layout.batch_key(RUN, LEASE, 42) == f"runs/{RUN}/batches/{LEASE}-42.parquet"
    assert layout.batch_key(str(RUN), str(LEASE), 42) == layout.batch_key(RUN, LEASE, 42)


def test_batch_keys_round_trip() -> None:
    key = layout.batch_key(RUN, LEASE, 7)
    assert layout.parse_batch_key(key) == (RUN, LEASE, 7)
    assert key.startswith(layout.batches_prefix(RUN))
    with pytest.raises(ValueError):
        layout.parse_batch_key(layout.adapter_key(RUN, 1, "a.json"))


def test_versions_sort_lexicographically() -> None:
    keys = [layout.adapter_prefix(RUN, v) for v in (10, 2, 100, 1)]
    assert sorted(keys) == [layout.adapter_prefix(RUN, v) for v in (1, 2, 10, 100)]


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "a..b", "x" * 300])
def test_file_names_cannot_escape_their_folder(name: str) -> None:
    with pytest.raises(ValueError):
        layout.adapter_key(RUN, 1, name)


def test_negative_numbers_and_bad_ids_are_refused() -> None:
    with pytest.raises(ValueError):
        layout.adapter_prefix(RUN, -1)
    with pytest.raises(ValueError):
        layout.batch_key(RUN, LEASE, -1)
    with pytest.raises(ValueError):
        layout.run_prefix("../../etc")


def test_a_probe_key_takes_only_a_probe_id() -> None:
    probe_id = "1765000000000-" + "0123456789abcdef" * 2
    key = layout.probe_key(probe_id)
    assert key == f"probes/{probe_id}" and layout.probe_made_ms(key) == 1765000000000
    for bad in ["", "../x", "1765000000000-" + "G" * 32, "176500000000-" + "0" * 32, "a/b"]:
        with pytest.raises(ValueError, match="not a bucket probe id"):
            layout.probe_key(bad)
    assert layout.probe_made_ms("probes/other") is None
    assert layout.probe_made_ms("runs/" + probe_id) is None
