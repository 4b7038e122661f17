"""The worker token file: written once at registration with mode 0600, reused on restart
(protocol/credentials.py, the file the pool learner keeps too; here under `worker_id`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protocol import credentials as stored

ID_FIELD = "worker_id"


@dataclass(frozen=True)
class Credentials:
    worker_id: str
    token: str
    server_url: str


def load(path: Path, server_url: str) -> Credentials | None:
    """The stored credentials for this server, or None (absent, unreadable or another server)."""
    found = stored.load(path, server_url, ID_FIELD)
    if found is None:
        return None
    return Credentials(worker_id=found.id, token=found.token, server_url=found.server_url)


def save(path: Path, creds: Credentials) -> None:
    """Write atomically; the file is created with mode 0600 (never readable by others)."""
    credential = stored.StoredCredential(creds.worker_id, creds.token, creds.server_url)
    stored.save(path, credential, ID_FIELD)
