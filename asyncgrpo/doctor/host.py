"""What a host will run with, read from the worker's or the learner's own settings: the server,
the token the process will present, the run, the model, the device and dtype."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from learner.config import POOL_ID_FIELD, LearnerSettings
from protocol import credentials as pool_credentials
from worker import credentials
from worker.capabilities import generation_dtype
from worker.config import WorkerSettings

if TYPE_CHECKING:
    from protocol.client import AsyncGrpoClient
    from protocol.schemas_doctor import RunModel, TokenCheck

Role = Literal["worker", "learner"]
LEARNER_CALL_TIMEOUT_S = 30.0  # the typed client's default, which the learner keeps
# The kind of token each role presents, and what to tell a host that has another.
WHERE_TOKENS_COME_FROM = {
    "learner": "the learner_token that POST /api/v1/runs answered when the run was created",
    "registration": "a registration token from an admin (POST /api/v1/registration-tokens, or "
    "the dashboard's Workers page)",
    "worker": "the worker token registration wrote to the token file",
    "pool_learner": "the pool learner token registration wrote to the credentials file",
}


@dataclass
class Host:
    role: Role
    server_url: str
    token: str | None
    token_source: str  # where the token comes from: "--token", "the token file …"
    # the kind of token the process needs: learner, registration, worker or pool_learner
    kind: str
    run_id: str | None
    model: str
    backend: str  # the worker's backend; "transformers" for the learner (it trains with it)
    device: str
    dtype: str
    gpu_memory_utilization: float | None  # vLLM's share of the GPU, for a vllm worker
    timeout_s: float
    install_extra: str  # the pip extra this role installs: worker or learner
    # filled by the checks, for the checks after them
    found: dict[str, Any] = field(default_factory=dict)

    @property
    def client(self) -> AsyncGrpoClient:
        return self.found["client"]  # type: ignore[no-any-return]

    @property
    def token_check(self) -> TokenCheck:
        return self.found["token"]  # type: ignore[no-any-return]

    @property
    def run(self) -> RunModel | None:
        return self.found.get("run")


def for_worker(settings: WorkerSettings, run_id: str | None) -> Host:
    """The worker presents its stored worker token (a rejoin) when the token file holds one for
    this server, else its registration token (worker/registration.py)."""
    stored = credentials.load(settings.token_file, settings.server_url)
    token: str | None = settings.registration_token
    source, kind = "--registration-token", "registration"
    if stored is not None:
        token, source, kind = stored.token, f"the token file {settings.token_file}", "worker"
    return Host(
        role="worker",
        server_url=settings.server_url,
        token=token,
        token_source=source,
        kind=kind,
        run_id=run_id,
        model=settings.model,
        backend=settings.backend,
        device=settings.device,
        dtype=generation_dtype(settings),  # `auto` resolved as the worker resolves it
        gpu_memory_utilization=(
            settings.vllm.gpu_memory_utilization if settings.backend == "vllm" else None
        ),
        timeout_s=settings.http_timeout_s,
        install_extra="worker",
    )


def for_learner(settings: LearnerSettings) -> Host:
    """A run's learner presents its --token; a pool learner (no --run) its stored pool token
    when the credentials file holds one for this server, else its registration token
    (learner/pool.py)."""
    token, source, kind = settings.token, "--token", "learner"
    if settings.pool:
        path = settings.pool_credentials_path()
        stored = pool_credentials.load(path, settings.server_url, POOL_ID_FIELD)
        token, source, kind = settings.registration_token, "--registration-token", "registration"
        if stored is not None:
            token, source, kind = stored.token, f"the credentials file {path}", "pool_learner"
    return Host(
        role="learner",
        server_url=settings.server_url,
        token=token,
        token_source=source,
        kind=kind,
        run_id=settings.run_id,
        model=settings.model,
        backend="transformers",
        device=settings.device,
        dtype=settings.dtype,
        gpu_memory_utilization=None,
        timeout_s=LEARNER_CALL_TIMEOUT_S,
        install_extra="learner",
    )
