"""Run by the fresh virtual environment's python (outside the repository) against the installed
wheel: where `server` comes from, the login page and one static asset, as one JSON line.

argv: a scratch folder, the static asset's path under /static/."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from starlette.testclient import TestClient

import server
from server.app import create_app
from server.config import Settings


def main(scratch: Path, asset: str) -> None:
    bucket = scratch / "bucket"
    bucket.mkdir()
    settings = Settings(
        database_url=f"sqlite:///{scratch / 'asyncgrpo.db'}",
        bucket_url=str(bucket),
        public_url="http://testserver",
        security={"secret_key": "wheel-test-secret-" + "x" * 32},
        print_admin_token=False,
        jobs={"mode": "celery"},  # no in-process scheduler
    )
    with TestClient(create_app(settings, migrate=True)) as client:
        login = client.get("/login")
        static = client.get(f"/static/{asset}")
    print(
        json.dumps(
            {
                "server_file": server.__file__,
                "login": {"status": login.status_code, "text": login.text},
                "static": {
                    "status": static.status_code,
                    "sha256": hashlib.sha256(static.content).hexdigest(),
                },
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
