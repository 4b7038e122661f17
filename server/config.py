"""Control-plane settings: one pydantic-settings root with nested groups (env prefix ASYNCGRPO_)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from protocol import settings_env
from protocol.gpu_prices import on_demand_prices
from protocol.outbound import OutboundPolicy, check_networks

EMBEDDED_DATABASE_URL = "sqlite:///./asyncgrpo.db"
EMBEDDED_BUCKET_URL = "./bucket"
# ASYNCGRPO_* names that belong to other parts, not to these settings: the worker's and the
# learner's own prefixes, the model cache, the worker's log level, the test and bench databases,
# the CLI's server URL and admin token.
FOREIGN_ENV_PREFIXES = ("ASYNCGRPO_WORKER_", "ASYNCGRPO_LEARNER_")
FOREIGN_ENV_NAMES = frozenset(
    {
        "ASYNCGRPO_MODEL_CACHE",
        "ASYNCGRPO_LOG_LEVEL",
        "ASYNCGRPO_TEST_PG_ADMIN_URL",
        "ASYNCGRPO_BENCH_PG",
        "ASYNCGRPO_BENCH_PG_URL",
        "ASYNCGRPO_SERVER",  # the CLI's `datasets` commands
        "ASYNCGRPO_ADMIN_TOKEN",
    }
)


class S3Settings(BaseModel):
    """How to reach an S3-compatible bucket (AWS S3, MinIO, R2, Hugging Face buckets)."""

    endpoint_url: str | None = Field(None, description="S3 endpoint; None means AWS.")
    region: str = Field("us-east-1", description="Region used to sign requests.")
    path_style: bool = Field(False, description="Path-style addressing (MinIO, moto).")
    access_key_id: str | None = Field(None, description="Access key; None uses boto3's chain.")
    secret_access_key: str | None = Field(None, description="Secret key; None uses boto3's chain.")
    create_bucket: bool = Field(
        False,
        description="A server that finds no bucket creates it (in `region`); off, it exits "
        "saying how to create it. A local-folder bucket is always created.",
    )


class SecuritySettings(BaseModel):
    """Secrets and request limits."""

    secret_key: str | None = Field(
        None,
        description="HMAC key for signed blob URLs and session cookies. Required outside the "
        "embedded mode; the embedded mode keeps a random one in ./asyncgrpo.secret.",
    )
    max_body_bytes: int = Field(
        64 * 1024 * 1024, description="Largest JSON or form body the API accepts (413 above)."
    )
    max_blob_bytes: int = Field(
        2 * 1024**3, description="Largest object accepted through the local store's blob URLs."
    )
    url_ttl_s: int = Field(900, description="Lifetime of presigned and signed blob URLs.")


class JobsSettings(BaseModel):
    """Background jobs."""

    mode: str = Field(
        "inprocess",
        description="'inprocess' runs the job functions inside the server; 'celery' leaves "
        "them to `asyncgrpo jobs`.",
    )
    broker_url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker URL.")
    sweep_interval_s: float = Field(2.0, description="Lease expiry sweep period.")
    cost_interval_s: float = Field(15.0, description="Cost accrual period.")
    alarm_interval_s: float = Field(15.0, description="Alarm evaluation period.")
    budget_interval_s: float = Field(10.0, description="Budget enforcement period.")
    retention_interval_s: float = Field(300.0, description="Bucket retention period.")
    webhook_interval_s: float = Field(5.0, description="Webhook delivery (and retry) period.")
    worker_silent_s: float = Field(
        60.0, description="A worker not seen for this long stops accruing cost (it is silent)."
    )
    webhook_max_attempts: int = Field(8, description="Deliveries tried this often, then failed.")
    webhook_backoff_s: float = Field(
        2.0, description="First retry delay; doubles after every failed attempt."
    )
    webhook_timeout_s: float = Field(10.0, description="Timeout of one webhook POST.")
    datasets_interval_s: float = Field(
        5.0,
        description="Period of the `datasets` job (checks uploaded datasets, loads Hugging Face "
        "ones) and of the `run_prep` job (makes the prompt rows of runs that are preparing); "
        "an upload or a run creation wakes them at once in the in-process mode.",
    )


class DatasetSettings(BaseModel):
    """Stored datasets (POST /api/v1/datasets and the `hf` kind)."""

    max_upload_bytes: int = Field(
        1024**3,
        ge=1,
        description="Largest dataset file accepted by POST /api/v1/datasets (413 above, before "
        "reading the body when Content-Length says so).",
    )
    max_row_bytes: int = Field(
        1024 * 1024,
        ge=1,
        description="Largest row of a dataset: one JSONL line, or one Parquet row as JSON (422 "
        "above).",
    )
    prepare_chunk_rows: int = Field(
        20_000,
        ge=100,
        le=1_000_000,
        description="Rows read, mapped and inserted per chunk when a run's prompt rows are made "
        "from a stored dataset (bounds the job's memory).",
    )
    hf_cache_dir: str | None = Field(
        None,
        description="Cache folder of the `datasets` library for `hf` datasets (None: its "
        "default, ~/.cache/huggingface).",
    )


class SweepSettings(BaseModel):
    """Sweeps: runs made at once from a base config and a grid (POST /api/v1/sweeps)."""

    max_runs: int = Field(
        64,
        ge=1,
        le=10_000,
        description="The most runs one sweep may create: a grid whose product of value counts "
        "(or a list of overrides) is longer is refused whole (422 sweep_too_large) before any "
        "run is made.",
    )


DEFAULT_ON_DEMAND_PRICES = on_demand_prices()  # protocol/gpu_prices.py: each with its source


class DashboardSettings(BaseModel):
    """The browser dashboard."""

    on_demand_prices: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_ON_DEMAND_PRICES),
        description="On-demand USD per hour for one GPU of each type (matched to a worker's "
        "gpu_type case-insensitively, times its gpu_count): the cost page's saving compares "
        "what workers cost with what the same hours would have cost on demand. The defaults' "
        "sources and dates: docs/reference/gpu-prices.md.",
    )
    session_max_age_s: int = Field(
        12 * 3600, description="A dashboard login lasts this long (signed session cookie)."
    )
    cookie_secure: bool = Field(
        False, description="Send the session cookie over HTTPS only (set behind TLS)."
    )


class AuditSettings(BaseModel):
    """The audit log (docs/guides/audit.md): who changed what, and the refused calls."""

    retention_days: float = Field(
        365.0,
        gt=0,
        le=36_500,
        description="Entries older than this many days are deleted by the `audit` job.",
    )
    refusals_per_minute: int = Field(
        20,
        ge=0,
        le=100_000,
        description="Refused calls (401, 403) recorded per minute from one source address "
        "with one token prefix; the rest of that minute are counted in one `suppressed` "
        "entry, not written one by one.",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Networks (CIDRs) of the reverse proxies in front of the server, e.g. "
        '["10.0.0.0/8"]: only a connection from one of them has its X-Forwarded-For read '
        "for an entry's source address; any other connection's own address is recorded.",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, cidrs: list[str]) -> list[str]:
        return check_networks(cidrs)


class Settings(BaseSettings):
    """Root settings. Nested groups use `__`, e.g. ASYNCGRPO_S3__ENDPOINT_URL."""

    model_config = SettingsConfigDict(
        env_prefix="ASYNCGRPO_", env_nested_delimiter="__", extra="ignore"
    )

    database_url: str = Field(
        EMBEDDED_DATABASE_URL,
        description="SQLAlchemy URL: sqlite:///file (embedded) or postgresql+psycopg://…",
    )
    database_pool_size: int = Field(
        20,
        ge=1,
        le=1000,
        description="Postgres connections each server process keeps open (SQLAlchemy pool_size); "
        "processes × (pool size + overflow) must stay under the server's max_connections.",
    )
    database_max_overflow: int = Field(
        20,
        ge=0,
        le=1000,
        description="Extra Postgres connections each server process may open under load.",
    )
    database_async_pool_size: int = Field(
        8,
        ge=1,
        le=1000,
        description="Postgres connections each server process keeps for the lease engine's "
        "one-statement units (acquire's read and grant, heartbeat, upload, complete's accept), "
        "which run on the event loop with psycopg's async driver instead of a request thread; "
        "counts toward max_connections beside the pool above. Grants on a run serialise on its "
        "run row, so more connections only queue inside Postgres (bench/leases.py).",
    )
    server_threads: int = Field(
        8,
        ge=1,
        le=256,
        description="Threads per server process that run the (synchronous) database work of "
        "requests. Python runs one at a time; measured on 2 cores, 8 threads served up to ~40% "
        "more lease cycles/s than 40 (bench/leases.py). Keep it at or below the database pool "
        "size.",
    )
    bucket_url: str = Field(
        EMBEDDED_BUCKET_URL, description="A local folder, or s3://bucket[/prefix]."
    )
    bucket_check_interval_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="Each server process checks its bucket this often (GET /readyz reports the "
        "last check) and records it on the database once it can be reached, without a restart.",
    )
    public_url: str = Field(
        "http://127.0.0.1:8000",
        description="Base URL workers and learners use to reach this server (signed blob URLs).",
    )
    s3: S3Settings = Field(default_factory=S3Settings, description="S3 connection options.")
    security: SecuritySettings = Field(
        default_factory=SecuritySettings, description="Secrets and limits."
    )
    jobs: JobsSettings = Field(default_factory=JobsSettings, description="Background jobs.")
    datasets: DatasetSettings = Field(
        default_factory=DatasetSettings, description="Stored datasets: limits and loading."
    )
    sweeps: SweepSettings = Field(
        default_factory=SweepSettings, description="Sweeps of runs (POST /api/v1/sweeps)."
    )
    dashboard: DashboardSettings = Field(
        default_factory=DashboardSettings, description="The browser dashboard."
    )
    audit: AuditSettings = Field(
        default_factory=AuditSettings, description="The audit log: retention, refusals, proxies."
    )
    lease_long_poll_s: float = Field(
        10.0, description="Longest time acquire and claim wait for work before answering."
    )
    long_poll_wakeups: bool = Field(
        True,
        description="Waiting calls (acquire, batch and eval claims) try again as soon as work "
        "may exist for them: an in-process notifier, and Postgres LISTEN/NOTIFY across server "
        "processes. False: they only poll, every long_poll_interval_s.",
    )
    long_poll_interval_s: float = Field(
        10.0,
        gt=0,
        le=60,
        description="Longest pause between a waiting call's tries when nothing wakes it: the "
        "fallback poll of a missed wake-up (0.25 s was the only way before wake-ups).",
    )
    version_poll_s: float = Field(
        0.1,
        gt=0,
        le=60,
        description="While workers long-poll GET /api/v1/versions, each server process reads "
        "the running runs' versions this often (one query per process, however many wait; a "
        "publish in the same process is seen at once).",
    )
    learner_lease_ttl_s: float = Field(
        30.0, description="A learner that stops heartbeating loses the run after this long."
    )
    idempotency_retention_s: float = Field(
        86400.0,
        ge=60,
        le=30 * 86400,
        description="How long the answer of a call made under an Idempotency-Key is kept: a "
        "retry within it gets the first answer; a key older than the answers let go of is "
        "refused (idempotency_key_expired), never applied again. The idempotency job deletes "
        "older answers (docs/architecture/protocol.md#safe-retries).",
    )
    print_admin_token: bool = Field(
        True, description="On first start with no admin token, create one and print it once."
    )
    outbound_allow_private: bool = Field(
        False,
        description="Let outbound calls for runs (webhooks) reach loopback, link-local and "
        "private addresses (protocol/outbound.py); off, only public addresses are reached.",
    )
    outbound_allow_cidrs: list[str] = Field(
        default_factory=list,
        description="Networks outbound calls may reach although not public, e.g. "
        '["10.20.0.0/16"] (a JSON list in ASYNCGRPO_OUTBOUND_ALLOW_CIDRS).',
    )

    @field_validator("outbound_allow_cidrs")
    @classmethod
    def _networks(cls, cidrs: list[str]) -> list[str]:
        return check_networks(cidrs)

    def outbound_policy(self) -> OutboundPolicy:
        """The policy every outbound call for a run goes through."""
        return OutboundPolicy.from_settings(self.outbound_allow_private, self.outbound_allow_cidrs)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_variables(cls, data: object) -> object:
        unknown = unknown_variables(os.environ)
        if unknown:
            raise ValueError("; ".join(unknown))
        return data

    @property
    def embedded(self) -> bool:
        return self.database_url.startswith("sqlite")

    @model_validator(mode="after")
    def _refuse_insecure_defaults(self) -> Settings:
        if not self.embedded and not self.security.secret_key:
            raise ValueError(
                "ASYNCGRPO_SECURITY__SECRET_KEY must be set outside the embedded (SQLite) mode"
            )
        if self.security.secret_key is not None and len(self.security.secret_key) < 32:
            raise ValueError("ASYNCGRPO_SECURITY__SECRET_KEY must be at least 32 characters")
        return self

    def secret_key(self) -> str:
        """The configured key, or the embedded mode's persisted random key."""
        if self.security.secret_key:
            return self.security.secret_key
        path = Path("asyncgrpo.secret")
        if not path.exists():
            path.write_text(secrets.token_urlsafe(48))
            path.chmod(0o600)
        return path.read_text().strip()


# Settings that were removed, with what to do instead (docs/decisions/0001-one-lease-engine.md).
RETIRED_SETTINGS = {
    "ASYNCGRPO_WORKER_CALLS_ON_EVENT_LOOP": "every worker call is answered by the one lease "
    "engine on both databases; remove the variable",
}


def setting_variables() -> list[str]:
    """Every environment variable name the Settings read (nested groups one level down)."""
    return settings_env.setting_variables(Settings)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A message for each ASYNCGRPO_* variable that is no setting (a typo is otherwise silently
    ignored), naming the closest setting when one is close."""
    return settings_env.unknown_variables(
        environ,
        Settings,
        what="a server setting (server/config.py)",
        ignore_prefixes=FOREIGN_ENV_PREFIXES,
        ignore_names=FOREIGN_ENV_NAMES,
        retired=RETIRED_SETTINGS,
    )


@lru_cache
def get_settings() -> Settings:
    return Settings()
