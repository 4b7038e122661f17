"""The wheel's smoke test (scripts/upgrade_deps.sh; docs/guides/installing.md): run by the python
of a fresh virtualenv that holds only the installed wheel and what its ranges resolved to, from
a scratch folder outside the repository. It starts `asyncgrpo server` on the embedded default
(SQLite, a local bucket folder), then a worker and a learner round trip through the typed
client over real HTTP: create a run, register a worker, attach the learner, lease prompts,
heartbeat and release the lease, claim batches. Prints one JSON line; exits 1 on any failure.

    python scripts/wheel_smoke.py SCRATCH_DIR
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from protocol.client import AsyncGrpoClient

MODEL = "smollm2-135m-instruct"
# the environment's own entry point, not whichever `asyncgrpo` PATH finds first
ASYNCGRPO = str(Path(sys.executable).with_name("asyncgrpo"))
RUN = {
    "name": "wheel-smoke",
    "base_model": MODEL,
    "dataset": {"kind": "generator", "generator": "arithmetic", "size": 8, "seed": 0},
    "rewards": [{"name": "numeric_match", "weight": 1.0, "kwargs": {}}],
    "group_size": 2,
    "prompts_per_lease": 2,
    "prompts_per_step": 2,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env() -> dict[str, str]:
    """The embedded default: no ASYNCGRPO_ setting from the caller's shell."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ASYNCGRPO_")}


def _cli(scratch: Path, *argv: str) -> str:
    out = subprocess.run(
        [ASYNCGRPO, *argv], cwd=scratch, env=_env(), capture_output=True, text=True, timeout=120
    )
    if out.returncode:
        raise SystemExit(f"asyncgrpo {' '.join(argv)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout.strip()


def _wait_healthy(api: AsyncGrpoClient, server: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:
            raise SystemExit(f"the server exited {server.returncode}:\n{log.read_text()}")
        try:
            api.healthz()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise SystemExit(f"the server did not answer in 60 s:\n{log.read_text()}") from None
            time.sleep(0.2)


def round_trip(url: str, admin_token: str) -> dict[str, Any]:
    admin = AsyncGrpoClient(url, admin_token, max_retries=0)
    created = admin.create_run(RUN)
    run_id = str(created["run"]["id"])
    registration = admin.create_registration_token(name="smoke")
    registered = admin.register_worker(registration["token"], name="smoke-worker", models=[MODEL])
    worker = AsyncGrpoClient(url, registered["token"], max_retries=0)
    learner = AsyncGrpoClient(url, created["learner_token"], max_retries=0)

    attached = learner.learner_attach(run_id, "smoke-fp", model=MODEL)
    lease = worker.acquire_lease(models=[MODEL], wait_s=0.0)
    if lease is None:
        raise SystemExit("no lease granted for a running run with queued prompts")
    beat = worker.heartbeat_lease(lease)
    released = worker.release_lease(lease)
    claimed = learner.claim_batches(run_id, attached.fencing, max_groups=4)
    learner_beat = learner.learner_heartbeat(run_id, attached.fencing)
    result = {
        "run": run_id,
        "lease_prompts": len(lease.prompts),
        "lease_heartbeat_aborted": beat.abort,
        "released_prompts": released.released,
        "claimed_batches": len(claimed.batches),
        "run_status": learner_beat.status,
    }
    expected = {
        "lease_prompts": RUN["prompts_per_lease"],
        "lease_heartbeat_aborted": False,
        "released_prompts": RUN["prompts_per_lease"],
        "claimed_batches": 0,
        "run_status": "running",
    }
    wrong = {k: (result[k], v) for k, v in expected.items() if result[k] != v}
    if wrong:
        raise SystemExit(f"unexpected answers (got, expected): {wrong}")
    return result


def main(scratch: Path) -> None:
    scratch.mkdir(parents=True, exist_ok=True)
    admin_token = _cli(scratch, "admin-token", "create", "--name", "smoke").splitlines()[-1]
    port = _free_port()
    log = scratch / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [ASYNCGRPO, "server", "--host", "127.0.0.1", "--port", str(port)],
            cwd=scratch,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(AsyncGrpoClient(url, None, max_retries=0), server, log)
        result = round_trip(url, admin_token)
    finally:
        server.terminate()
        server.wait(30)
    import httpx

    import asyncgrpo

    result["asyncgrpo_file"] = asyncgrpo.__file__
    result["httpx"] = httpx.__version__
    print(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
