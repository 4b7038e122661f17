"""Object-store throughput: upload + download + sha256 of 5, 40 and 80 MB payloads.

Paths measured (each a full round trip, median of --repeats):
  s3 presigned   moto's S3 server (own process) through presigned PUT/GET and protocol/transfer.py
                 — the worker/learner path
  s3 boto3       the same server through S3Store.put_file / download_file (+ sha256 of the result)
  local /blobs   the real control plane (uvicorn, own process, SQLite) serving the local store's
                 HMAC-signed URLs, through protocol/transfer.py
  plain copy     shutil.copyfile of the same bytes on this disk (the baseline of the ratio)

Upload time includes hashing the source (the client must sign its sha256); download time
includes the streaming sha256 check. Ratio = round-trip time / one plain copy.

    .venv/bin/python bench/bucket.py [--sizes 5 40 80] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncgrpo.cluster import Cluster  # noqa: E402
from bench import report  # noqa: E402
from protocol.storage import ObjectStore, sha256_file
from protocol.storage_local import LocalStore
from protocol.storage_s3 import S3Store
from protocol.transfer import download_url, upload_presigned
from tests.harness.stack import cluster_config, moto_process

MB = 1024 * 1024
SECRET = "bench-secret-" + "x" * 40
KEYS = ("bench-access-key", "bench-secret-key")


@contextmanager
def moto_s3(work: Path) -> Iterator[S3Store]:
    """moto's S3 server in its own process (tests/harness/stack.py) with a fresh bucket."""
    with moto_process(work, KEYS) as moto:
        yield S3Store(
            bucket=moto.bucket.bucket,
            endpoint_url=moto.bucket.endpoint.url,
            path_style=True,
            access_key_id=KEYS[0],
            secret_access_key=KEYS[1],
        )


@contextmanager
def control_plane(work: Path) -> Iterator[LocalStore]:
    """The real app under uvicorn on 127.0.0.1 (asyncgrpo.cluster), embedded SQLite, a local
    bucket folder."""
    with Cluster(cluster_config(work / "control-plane", secret_key=SECRET)) as cluster:
        cluster.start_server()
        yield LocalStore(Path(cluster.bucket_location), cluster.url + "/blobs", SECRET)


@dataclass
class Sample:
    up_s: float
    down_s: float


def presigned_round_trip(
    store: ObjectStore, http: httpx.Client, src: Path, dest: Path, key: str
) -> Sample:
    t0 = time.perf_counter()
    sha, size = sha256_file(src), src.stat().st_size
    put = store.presign_put(key, size=size, sha256_hex=sha, ttl_s=600, if_none_match=True)
    upload_presigned(put, src, http=http)
    t1 = time.perf_counter()
    download_url(store.presign_get(key, 600), dest, sha, http=http)
    t2 = time.perf_counter()
    store.delete(key)
    return Sample(t1 - t0, t2 - t1)


def boto3_round_trip(store: S3Store, src: Path, dest: Path, key: str) -> Sample:
    t0 = time.perf_counter()
    sha = sha256_file(src)
    store.put_file(key, src, if_none_match=True)
    t1 = time.perf_counter()
    store.download_file(key, dest)
    if sha256_file(dest) != sha:
        raise RuntimeError("boto3 round trip changed the bytes")
    t2 = time.perf_counter()
    store.delete(key)
    return Sample(t1 - t0, t2 - t1)


def copy_once(src: Path, dest: Path) -> Sample:
    t0 = time.perf_counter()
    shutil.copyfile(src, dest)
    with open(dest, "rb") as f:  # a copy really lands: flush it, as the stores' files do not
        os.fsync(f.fileno())
    return Sample(time.perf_counter() - t0, 0.0)


def median_sample(run: Callable[[int], Sample], repeats: int) -> Sample:
    samples = [run(i) for i in range(repeats)]
    return Sample(
        statistics.median(s.up_s for s in samples), statistics.median(s.down_s for s in samples)
    )


def figure(name: str, mb: int, s: Sample, copy_s: float) -> dict[str, Any]:
    """One path at one size, as the --json line carries it."""
    total = s.up_s + s.down_s
    return {
        "path": name, "mb": mb, "up_s": s.up_s, "down_s": s.down_s, "round_trip_s": total,
        "round_trip_mb_per_s": mb / total, "vs_copy": total / copy_s,
    }  # fmt: skip


def row(name: str, mb: int, s: Sample, copy_s: float) -> str:
    total = s.up_s + s.down_s
    up = f"{mb / s.up_s:8.1f}" if s.up_s else "       -"
    down = f"{mb / s.down_s:8.1f}" if s.down_s else "       -"
    return (
        f"| {name:<14} | {mb:>4} | {up} | {down} | {mb / total:8.1f} | {s.up_s * 1000:8.0f} | "
        f"{s.down_s * 1000:8.0f} | {total * 1000:8.0f} | {total / copy_s:6.1f}x |"
    )


def bench_size(
    mb: int, s3: S3Store, local: LocalStore, http: httpx.Client, work: Path, repeats: int
) -> list[tuple[str, int, Sample, float]]:
    """(path, MB, median sample, plain-copy seconds) per path at this size."""
    src = work / f"payload-{mb}.bin"
    src.write_bytes(os.urandom(mb * MB))
    dest = work / "out.bin"
    copy = median_sample(lambda i: copy_once(src, dest), repeats)
    runs: dict[str, Callable[[int], Sample]] = {
        "s3 presigned": lambda i: presigned_round_trip(s3, http, src, dest, f"b/{mb}/p{i}"),
        "s3 boto3": lambda i: boto3_round_trip(s3, src, dest, f"b/{mb}/b{i}"),
        "local /blobs": lambda i: presigned_round_trip(local, http, src, dest, f"b/{mb}/l{i}"),
    }
    measured = [("plain copy", mb, copy, copy.up_s)]
    for name, run in runs.items():
        measured.append((name, mb, median_sample(run, repeats), copy.up_s))
    src.unlink()
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 40, 80], help="MB")
    parser.add_argument("--repeats", type=int, default=3)
    report.add_json_flag(parser)
    args = parser.parse_args()
    header = (
        "| path           |   MB | up MB/s  | down MB/s| rt MB/s  |  up ms   | down ms  |"
        "  rt ms   | vs copy |\n|" + "|".join(["---"] * 9) + "|"
    )
    measured: list[tuple[str, int, Sample, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-bucket-") as tmp:
        work = Path(tmp)
        http = httpx.Client(timeout=httpx.Timeout(60.0, read=300.0, write=300.0))
        with moto_s3(work) as s3, control_plane(work) as local:
            for mb in args.sizes:
                measured.extend(bench_size(mb, s3, local, http, work, args.repeats))
                print(f"  {mb} MB done", file=sys.stderr, flush=True)
        http.close()
    print(
        f"\nmedian of {args.repeats}; rt = upload + download round trip; "
        f"vs copy = rt time / one plain copy (fsynced) of the same bytes\n"
    )
    print("\n".join([header, *(row(*m) for m in measured)]))
    report.emit(args, {"repeats": args.repeats, "paths": [figure(*m) for m in measured]})


if __name__ == "__main__":
    main()
