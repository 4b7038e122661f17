"""The checks that ask the server (docs/architecture/protocol.md, "Host checks"): reachable,
the token the process will present, the release, the run, the bucket through signed URLs."""

from __future__ import annotations

import base64
from urllib.parse import urlsplit

import httpx

from asyncgrpo.doctor.checks import Outcome, failed, passed, skipped
from asyncgrpo.doctor.host import WHERE_TOKENS_COME_FROM, Host
from protocol.client import TRANSIENT_ERRORS, ApiError, AsyncGrpoClient
from protocol.requirements import release
from protocol.schemas import TERMINAL_RUN_STATUSES
from protocol.storage import PresignedPut
from protocol.transfer import upload_presigned


def _refusal(exc: ApiError) -> str:
    return f"{exc.status_code} {exc.code or 'error'} ({exc.detail})"


def server(host: Host) -> Outcome:
    client = AsyncGrpoClient(
        host.server_url, host.token, timeout_s=min(host.timeout_s, 10.0), max_retries=0
    )
    host.found["client"] = client
    try:
        client.healthz()
    except TRANSIENT_ERRORS as exc:
        return failed(
            f"cannot reach {host.server_url}: {type(exc).__name__} {exc}".strip(),
            "check --server (scheme, host and port), that `asyncgrpo server` runs there and "
            "that this host's network reaches it",
        )
    except ApiError as exc:
        return failed(
            f"{host.server_url} answers /healthz with {_refusal(exc)}",
            "the server cannot use its database: see the server's log and GET /readyz",
        )
    return passed(f"{host.server_url} answers, and so does its database")


def token(host: Host) -> Outcome:
    wanted = f"a {host.kind} token ({WHERE_TOKENS_COME_FROM[host.kind]})"
    if not host.token:
        return failed(
            f"no token: the token file holds none for {host.server_url} and no "
            f"{host.token_source} is given",
            f"give {host.token_source} with {wanted}",
        )
    try:
        seen = host.client.doctor_token()
    except ApiError as exc:
        return failed(
            f"the server refuses the token from {host.token_source}: {_refusal(exc)}",
            f"give {host.token_source} {wanted}",
        )
    host.found["token"] = seen
    if seen.kind != host.kind:
        return failed(
            f"{host.token_source} is a {seen.kind} token ({seen.prefix}…); a {host.role} needs "
            f"a {host.kind} token",
            f"give {host.token_source} {wanted}",
        )
    return _token_fits(host)


def _token_fits(host: Host) -> Outcome:
    seen = host.token_check
    expiry = f", expires {seen.expires_at:%Y-%m-%d %H:%M} UTC" if seen.expires_at else ""
    if seen.kind == "learner" and str(seen.run_id) != host.run_id:
        return failed(
            f"this learner token ({seen.prefix}…) is run {seen.run_id}'s, not --run {host.run_id}",
            f"give --run {seen.run_id}, or the learner token of run {host.run_id}",
        )
    if seen.kind == "registration" and seen.max_uses is not None:
        used = seen.uses or 0
        if used >= seen.max_uses:
            return failed(
                f"registration token {seen.prefix}… is used up ({used} of {seen.max_uses})",
                f"give --registration-token {WHERE_TOKENS_COME_FROM['registration']}",
            )
        return passed(
            f"registration token {seen.prefix}…, {seen.max_uses - used} of {seen.max_uses} "
            f"uses left{expiry}"
        )
    scope = {
        "learner": f" of run {seen.run_id}",
        "worker": f" of worker {seen.worker_id}",
        "pool_learner": f" of pool learner {seen.pool_learner_id}",
    }
    return passed(f"{seen.kind} token {seen.prefix}…{scope.get(seen.kind, '')}{expiry}")


def version(host: Host) -> Outcome:
    theirs, ours = host.token_check.server_version, release()
    if theirs != ours:
        return failed(
            f"the server runs asyncgrpo {theirs}, this host {ours}",
            f"install asyncgrpo {theirs} on this host (or upgrade both to one release)",
        )
    return passed(f"server and host both run asyncgrpo {ours}")


def run(host: Host) -> Outcome:
    if host.run_id is None:
        return skipped("no --run given: the model is compared with a run's only when one is named")
    try:
        found = host.client.doctor_run(host.run_id)
    except ApiError as exc:
        return failed(
            f"run {host.run_id}: {_refusal(exc)}",
            "give --run the id of a run of this server (GET /api/v1/runs, the dashboard)",
        )
    host.found["run"] = found
    if found.status in TERMINAL_RUN_STATUSES:
        return failed(
            f"run {found.run_id} is {found.status}: there is nothing left to do in it",
            "name a run that has not ended",
        )
    return passed(f"run {found.run_id} is {found.status}, base model {found.base_model}")


def bucket(host: Host) -> Outcome:
    """PUT the probe's bytes and GET them back through the URLs the server signed, then have
    the server read and delete its object."""
    probe = host.client.create_bucket_probe()
    content = base64.b64decode(probe.content_b64)
    where = _origin(probe.put.url)
    put = PresignedPut(probe.put.url, probe.put.headers, probe.put.expires_in_s)
    fix = (
        f"this host must reach {where}, where the server signs its bucket URLs (the server's "
        "ASYNCGRPO_S3__ENDPOINT_URL, or ASYNCGRPO_PUBLIC_URL for a local bucket, must name an "
        "address hosts reach)"
    )
    try:
        upload_presigned(put, content, attempts=1)
    except Exception as exc:  # noqa: BLE001 - TransferError, or the transport's own error
        return failed(f"PUT to {where} failed: {exc}", fix)
    try:
        read = _get(probe.get_url, host.timeout_s)
    except httpx.HTTPError as exc:
        return failed(f"GET from {where} failed: {exc}", fix)
    finally:
        checked = _server_side(host, probe.probe_id)
    if read != content:
        return failed(f"GET from {where} answered other bytes than the PUT sent", fix)
    if isinstance(checked, str):
        return failed(checked, "the server and this host reach different buckets: see its log")
    return passed(f"PUT and GET of a {len(content)}-byte probe through {where}; the server "
                  "read it back and deleted it")  # fmt: skip


def _server_side(host: Host, probe_id: str) -> object:
    """The server's check of the probe (which deletes it), or why it failed."""
    try:
        answer = host.client.check_bucket_probe(probe_id)
    except ApiError as exc:
        return f"the server did not find the probe this host uploaded: {_refusal(exc)}"
    return answer if answer.intact else "the server read other bytes than this host uploaded"


def _get(url: str, timeout_s: float) -> bytes:
    with httpx.Client(timeout=timeout_s) as http:  # no credentials: the URL is its own
        response = http.get(url)
        response.raise_for_status()
        return response.content


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
