"""A large uploaded dataset end to end: build an N-row Parquet file (GSM8K-like: question,
answer), upload it to an in-process control plane (uvicorn in this process, local bucket,
in-process jobs), and time until the dataset is ready and until a run on it is prepared
(`preparing` → `pending`: every dataset row mapped and inserted, every prompt row queued).
Peak RSS is this process's (the server, its jobs and the upload client); the file is built in a
child process so that it does not count. Targets (issue 18): 1M rows ready and prepared in
≤ 5 min and ≤ 2 GB RSS.

    .venv/bin/python bench/datasets.py [--rows 1000000] [--db sqlite|postgres] [--json]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report  # noqa: E402

SECRET = "bench-secret-" + "x" * 40
BUILD = """
import sys, pyarrow as pa, pyarrow.parquet as pq
n, out = int(sys.argv[1]), sys.argv[2]
writer = None
for start in range(0, n, 100_000):
    ids = range(start, min(n, start + 100_000))
    table = pa.table({
        "question": [f"Problem {i}: a baker bakes {i % 97 + 3} loaves a day for "
                     f"{i % 13 + 2} days and sells {i * 7 % 101} of them. How many "
                     "loaves are left?" for i in ids],
        "answer": [str((i % 97 + 3) * (i % 13 + 2) - i * 7 % 101) for i in ids],
    })
    writer = writer or pq.ParquetWriter(out, table.schema)
    writer.write_table(table)
writer.close()
"""


def rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_file(rows: int, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", BUILD, str(rows), str(out)], check=True)
    return time.perf_counter() - start


@contextmanager
def database(kind: str, work: Path) -> Iterator[str]:
    if kind == "postgres":
        from bench.common import postgres_db

        with postgres_db() as url:
            yield url
    else:
        yield f"sqlite:///{work / 'bench.db'}"


def _wait(client: httpx.Client, path: str, waiting: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        body: dict[str, Any] = client.get(path).json()
        if body["status"] != waiting or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def measure(rows: int, db: str, work: Path, timeout_s: float = 1800) -> dict[str, Any]:
    from server.app import create_app
    from server.config import Settings
    from server.db import transaction
    from server.tokens import service as tokens
    from tests.harness.serve import serve_in_thread

    data = work / "data.parquet"
    built_s = build_file(rows, data)
    with database(db, work) as url:
        settings = Settings(
            database_url=url,
            bucket_url=str(work / "bucket"),
            security={"secret_key": SECRET},
            print_admin_token=False,
            jobs={"mode": "inprocess", "datasets_interval_s": 1.0},
        )
        app = create_app(settings, migrate=True)
        with transaction(app.state.sessionmaker) as session:
            token = tokens.mint(session, "admin", name="bench").plaintext
        rss_idle = rss_mb()
        with (
            serve_in_thread(app) as base,
            httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=600
            ) as client,
        ):
            start = time.perf_counter()
            with open(data, "rb") as f:
                created = client.post("/api/v1/datasets", params={"name": data.name}, content=f)
            assert created.status_code == 202, created.text
            uploaded_s = time.perf_counter() - start
            dataset_id = created.json()["id"]
            ready = _wait(client, f"/api/v1/datasets/{dataset_id}", "pending", timeout_s)
            ready_s = time.perf_counter() - start
            assert ready["status"] == "ready", ready
            run_start = time.perf_counter()
            config = {
                "name": "bench-datasets",
                "base_model": "smollm2-135m-instruct",
                "dataset": {"kind": "uploaded", "id": dataset_id, "prompt_column": "question"},
                "rewards": [{"name": "numeric_match"}],
            }
            made = client.post("/api/v1/runs", json=config)
            assert made.status_code == 201, made.text
            run = _wait(client, f"/api/v1/runs/{made.json()['run']['id']}", "preparing", timeout_s)
            prepared_s = time.perf_counter() - run_start
            assert run["status"] == "pending", run
            queued = run["stats"]["prompt_rows"].get("queued", 0)
    return {
        "rows": rows,
        "db": db,
        "file_mb": round(data.stat().st_size / 2**20, 1),
        "build_s": round(built_s, 1),
        "upload_s": round(uploaded_s, 1),
        "ready_s": round(ready_s, 1),
        "run_prepared_s": round(prepared_s, 1),
        "total_s": round(ready_s + prepared_s, 1),
        "queued_prompt_rows": queued,
        "rss_idle_mb": round(rss_idle),
        "rss_peak_mb": round(rss_mb()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="Rows of the Parquet file.")
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    report.add_json_flag(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agr-bench-ds-") as folder:
        figures = measure(args.rows, args.db, Path(folder))
    for key, value in figures.items():
        print(f"{key:>20}: {value}")
    report.emit(args, figures)


if __name__ == "__main__":
    main()
