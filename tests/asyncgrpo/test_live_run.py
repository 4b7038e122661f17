"""What a run started in a folder an earlier one used says it reuses (asyncgrpo/live_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

from asyncgrpo.live_run import reuse_notes


def test_a_rerun_in_the_same_folder_says_what_it_reuses(tmp_path: Path) -> None:
    assert reuse_notes(tmp_path) == []
    (tmp_path / "asyncgrpo.db").write_bytes(b"")
    (tmp_path / "bucket").mkdir()
    token = tmp_path / "workers" / "demo-worker-1" / "token.json"
    token.parent.mkdir(parents=True)
    token.write_text(json.dumps({"server_url": "http://127.0.0.1:1"}))
    notes = "\n".join(reuse_notes(tmp_path))
    assert "asyncgrpo.db" in notes and "bucket/" in notes and "demo-worker-1" in notes
