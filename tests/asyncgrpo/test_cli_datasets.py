"""`asyncgrpo datasets upload` and `list` against a real server over HTTP (in-process jobs: the
upload wakes the `datasets` job, which makes the dataset ready)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from asyncgrpo.cli import app as cli
from tests.conftest import make_settings, mint_token
from tests.harness.serve import serve_in_thread
from tests.server.datasets.files import QUESTIONS, jsonl


def test_upload_then_list(sqlite_url: str, tmp_path: Path) -> None:
    from server.app import create_app

    settings = make_settings(sqlite_url, tmp_path / "bucket", jobs={"mode": "inprocess"})
    application = create_app(settings, migrate=True)
    token = mint_token(application, "admin", name="cli")
    good = tmp_path / "questions.jsonl"
    good.write_bytes(jsonl(QUESTIONS))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"question": "ok"}\n{"question": "\xff"}\n')
    runner = CliRunner()
    with serve_in_thread(application) as base:
        common = ["--server", base, "--token", token]
        uploaded = runner.invoke(cli, ["datasets", "upload", str(good), *common])
        assert uploaded.exit_code == 0, uploaded.output
        dataset_id = uploaded.output.split()[0]
        assert "6 rows" in uploaded.output and "question, answer, source" in uploaded.output

        deadline = time.monotonic() + 20
        status = "pending"
        while status == "pending" and time.monotonic() < deadline:
            time.sleep(0.1)
            status = httpx.get(
                f"{base}/api/v1/datasets/{dataset_id}",
                headers={"Authorization": f"Bearer {token}"},
            ).json()["status"]
        assert status == "ready"

        listed = runner.invoke(cli, ["datasets", "list", *common])
        assert listed.exit_code == 0, listed.output
        assert dataset_id in listed.output and "ready" in listed.output
        assert "questions.jsonl" in listed.output

        refused = runner.invoke(cli, ["datasets", "upload", str(bad), *common])
        assert refused.exit_code == 2
        assert "422: line 2: not UTF-8" in refused.output
