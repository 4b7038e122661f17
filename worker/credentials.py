"""The worker token file: written once at registration with mode 0600, reused on restart."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Credentials:
    worker_id: str
    token: str
    server_url: str


def load(path: Path, server_url: str) -> Credentials | None:
    """The stored credentials for this server, or None (absent, unreadable or another server)."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("server_url") != server_url.rstrip("/"):
        return None
    token, worker_id = data.get("token"), data.get("worker_id")
    if not isinstance(token, str) or not isinstance(worker_id, str):
        return None
    return Credentials(worker_id=worker_id, token=token, server_url=data["server_url"])


def save(path: Path, creds: Credentials) -> None:
    """Write atomically; the file is created with mode 0600 (never readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        payload = {
            "worker_id": creds.worker_id,
            "token": creds.token,
            "server_url": creds.server_url.rstrip("/"),
        }
        os.write(fd, json.dumps(payload).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
