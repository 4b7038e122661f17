"""The worker's credentials: the token file's (a rejoin), or a registration with the
registration token. `asyncgrpo worker` gets them before its model loads, so a token the server
refuses (used up, revoked, unknown) ends the start at once with one line."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from protocol.client import ApiError, AsyncGrpoClient
from worker import capabilities, credentials
from worker.config import WorkerSettings
from worker.retry import retry

log = logging.getLogger("worker")


class RegistrationRefused(RuntimeError):
    """The worker has no token and cannot get one (no registration token, or it is refused)."""


def obtain_credentials(
    settings: WorkerSettings,
    *,
    environments: list[str],
    stop: threading.Event,
    new_client: Callable[[str | None], AsyncGrpoClient],
) -> credentials.Credentials:
    """The stored credentials, or new ones from registering (saved to the token file). Network
    failures and 5xx are retried until `stop`; a 4xx answer is RegistrationRefused."""
    s = settings
    stored = credentials.load(s.token_file, s.server_url)
    if stored is not None:
        _check_stored(settings, stored, stop=stop, new_client=new_client)
        log.info("rejoining as worker %s (its token in %s)", stored.worker_id, s.token_file)
        return stored
    if not s.registration_token:
        raise RegistrationRefused(
            f"no worker token in {s.token_file} and no --registration-token given"
        )
    token = s.registration_token
    anonymous = new_client(None)
    try:
        answer = retry(
            "register",
            lambda: anonymous.register_worker(
                token,
                name=s.name or socket.gethostname(),
                gpu_type=s.gpu_type,
                gpu_count=s.gpu_count,
                price_per_hour=s.price_per_hour,
                models=[s.model],
                environments=environments,
                capabilities=capabilities.declared(s),
            ),
            stop=stop,
            cap_s=s.retry_max_s,
        )
    except ApiError as exc:  # retry() raises only the answers not worth retrying (4xx)
        raise RegistrationRefused(
            f"the server {s.server_url} refused to register this worker ({exc.status_code}: "
            f"{exc.detail}); ask an admin for a new registration token (POST "
            "/api/v1/registration-tokens)"
        ) from None
    finally:
        anonymous.close()
    creds = credentials.Credentials(str(answer["id"]), answer["token"], s.server_url)
    credentials.save(s.token_file, creds)
    log.info("registered as worker %s (its token in %s)", creds.worker_id, s.token_file)
    return creds


def _check_stored(
    settings: WorkerSettings,
    stored: credentials.Credentials,
    *,
    stop: threading.Event,
    new_client: Callable[[str | None], AsyncGrpoClient],
) -> None:
    """One cheap call with the stored token (a versions read that does not wait): a worker
    revoked, or a token the server does not know (its database replaced), is refused here."""
    client = new_client(stored.token)
    try:
        retry(
            "check the worker token",
            lambda: client.wait_versions({}, wait_s=0),
            stop=stop,
            cap_s=settings.retry_max_s,
        )
    except ApiError as exc:
        raise RegistrationRefused(
            f"the server {settings.server_url} refused the worker token in {settings.token_file} "
            f"({exc.status_code}: {exc.detail}); remove that file and start again with a new "
            "--registration-token"
        ) from None
    finally:
        client.close()
