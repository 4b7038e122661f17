"""What the tracker tests share: a run config holding secrets, and a search for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "runs" / "arithmetic.json"
HOOK_SECRET = "hook-secret-5d41402a"
WEBHOOK = f"https://hooks.example.com/services/T0/{HOOK_SECRET}"
TOKEN = "agr_lrn_probe-secret-7f3a9c"  # on the probe's command line, as --token
RUN_ID = "0b7c5a9e-2f51-4d6e-9b0a-3c7e1f2d4a5b"
SECRETS = (HOOK_SECRET, TOKEN)
# the environment of the tracker libraries and of the learner, left out of a probe's
_OWN_PREFIXES = ("ASYNCGRPO_LEARNER_", "WANDB_", "MLFLOW_", "TRACKIO_")


def secret_config(**tracking: Any) -> dict[str, Any]:
    """The example run config with a secret webhook and a tracking block."""
    raw: dict[str, Any] = json.loads(EXAMPLE.read_text())
    raw["alarms"]["webhook_url"] = WEBHOOK
    raw["tracking"] = tracking or None
    return raw


def run_probe(tmp: Path, config: dict[str, Any], env: dict[str, str]) -> str:
    """tests/learner/tracking/probe.py in its own process; its stdout."""
    path = tmp / "run_config.json"
    path.write_text(json.dumps(config))
    base = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_PREFIXES)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.learner.tracking.probe", str(path), RUN_ID, "--token", TOKEN],
        env={**base, "OMP_NUM_THREADS": "1", **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def assert_no_secret(folder: Path) -> int:
    """No file under folder holds a secret; returns how many files were searched."""
    files = [f for f in folder.rglob("*") if f.is_file()]
    for f in files:
        data = f.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} in {f}"
    return len(files)


def grep(folder: Path, text: str) -> bool:
    return any(text.encode() in f.read_bytes() for f in folder.rglob("*") if f.is_file())
