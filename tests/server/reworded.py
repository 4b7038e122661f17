"""Every message of the server reworded: what a program reads must be the error code."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from server.errors import AppError

PREFIX = "reworded "


def reword_every_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each AppError's message becomes words no program could match (a digest of the old)."""
    original = AppError.__init__

    def reword(self: AppError, message: str, **kwargs: Any) -> None:
        original(self, PREFIX + hashlib.sha256(message.encode()).hexdigest()[:8], **kwargs)

    monkeypatch.setattr(AppError, "__init__", reword)
