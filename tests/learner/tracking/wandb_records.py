"""Read back what an offline W&B run wrote: its `run-<id>.wandb` file is a LevelDB-style log
(a 7-byte header `:W&B` + ident + version, then 32 KiB blocks of records: CRC-32 (4 bytes),
length (2, little-endian), type (1: full, 2: first, 3: middle, 4: last), data), each record's
data one `wandb_internal_pb2.Record` protobuf (the classes come with the wandb package)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> list[bytes]:
    assert data[:4] == b":W&B", data[:8]
    out: list[bytes] = []
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
            pending = b""
    return out


def read_run(wandb_dir: Path) -> dict[str, Any]:
    """{"history": [{key: value, …} per logged row], "config": {key: value}} of the one
    offline run under wandb_dir."""
    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(wandb_dir.rglob("run-*.wandb"))
    assert len(files) == 1, files
    history: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    for payload in _payloads(files[0].read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        which = record.WhichOneof("record_type")
        if which == "history":
            history.append(
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
            )
        elif which == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif which == "run":
            for item in record.run.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return {"history": history, "config": config}
