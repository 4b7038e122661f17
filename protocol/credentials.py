"""A credential file written once at registration (mode 0600) and reused on restart: the token
a registration token bought, for one server. The worker's token file and the pool learner's
credentials file are both this file; each names its id field (`worker_id`, `learner_id`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StoredCredential:
    id: str
    token: str
    server_url: str


def load(path: Path, server_url: str, id_field: str) -> StoredCredential | None:
    """The stored credential for this server, or None (absent, unreadable or another server)."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("server_url") != server_url.rstrip("/"):
        return None
    token, ident = data.get("token"), data.get(id_field)
    if not isinstance(token, str) or not isinstance(ident, str):
        return None
    return StoredCredential(id=ident, token=token, server_url=data["server_url"])


def save(path: Path, credential: StoredCredential, id_field: str) -> None:
    """Write atomically; the file is created with mode 0600 (never readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        payload = {
            id_field: credential.id,
            "token": credential.token,
            "server_url": credential.server_url.rstrip("/"),
        }
        os.write(fd, json.dumps(payload).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
