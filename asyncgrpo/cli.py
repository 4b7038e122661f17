"""The `asyncgrpo` command. Each subcommand imports only what it needs: `asyncgrpo worker` and
`asyncgrpo learner` never import the web stack or SQLAlchemy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer

from asyncgrpo import plan_cli
from asyncgrpo.audit_cli import audit_app
from asyncgrpo.datasets_cli import datasets_app
from asyncgrpo.doctor.cli import doctor_app
from asyncgrpo.help_layout import App
from asyncgrpo.local_config import LocalSettings
from asyncgrpo.project_cli import project_app
from asyncgrpo.run_cli import run_app
from asyncgrpo.settings_options import settings_command
from asyncgrpo.sweep_cli import sweep_app
from learner.config import LearnerSettings
from worker.config import WorkerSettings

app = App(
    help="Asynchronous GRPO + LoRA fine-tuning on cheap, elastic, preemptible GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = App(help="Database schema (Alembic).", no_args_is_help=True)
admin_token_app = App(help="Admin API tokens.", no_args_is_help=True)
app.add_typer(db_app, name="db")
registration_token_app = App(help="Worker registration tokens.", no_args_is_help=True)
app.add_typer(admin_token_app, name="admin-token")
app.add_typer(registration_token_app, name="registration-token")
app.add_typer(datasets_app, name="datasets")
app.add_typer(doctor_app, name="doctor")
app.add_typer(sweep_app, name="sweep")
app.add_typer(project_app, name="project")
app.add_typer(run_app, name="run")
app.add_typer(audit_app, name="audit")
app.command("plan")(plan_cli.plan)


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _settings():  # type: ignore[no-untyped-def]
    from pydantic import ValidationError

    from server.config import Settings

    try:
        return Settings()
    except ValidationError as exc:
        _fail("; ".join(e["msg"] for e in exc.errors()))


def _with_listening_url(settings: Any, host: str, port: int) -> Any:
    """Without an explicit public_url, signed URLs must point where this server listens. The
    environment carries it to `--workers` processes, which build their own settings."""
    import os

    if "public_url" in settings.model_fields_set:
        return settings
    reachable = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in reachable:
        reachable = f"[{reachable}]"
    url = f"http://{reachable}:{port}"
    os.environ["ASYNCGRPO_PUBLIC_URL"] = url
    return settings.model_copy(update={"public_url": url})


@app.command()
def server(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    workers: int = typer.Option(1, help="Uvicorn worker processes (Postgres only)."),
) -> None:
    """Run the control plane (API, rollout proxy, dashboard). With no configuration it uses the
    embedded default: ./asyncgrpo.db (SQLite), ./bucket, in-process jobs."""
    import uvicorn

    settings = _with_listening_url(_settings(), host, port)
    if settings.embedded and workers != 1:
        _fail("the embedded SQLite mode runs one server process; use Postgres for --workers > 1")
    if settings.embedded:
        from server.app import create_app

        application = create_app(settings)  # migrates the embedded database
        _refuse_another_bucket(settings, first=True)
        uvicorn.run(application, host=host, port=port, log_level="info", proxy_headers=False)
        return
    _refuse_an_old_schema(settings)
    # checked here too, once: a worker process failing its startup would be restarted in a loop
    _refuse_another_bucket(settings, first=True)
    if settings.print_admin_token:  # once, before the processes start (each would mint one)
        _print_first_admin_token(settings)
    # proxy_headers off: the connection's own address reaches the app; the audit log reads
    # X-Forwarded-For itself, from `audit.trusted_proxies` only (server/audit/source.py)
    uvicorn.run(
        "server.main:app",
        host=host,
        port=port,
        workers=workers,
        log_level="info",
        proxy_headers=False,
    )


@app.command()
def jobs(
    beat: bool = typer.Option(
        True, "--beat/--no-beat", help="Embed the beat scheduler (-B); run it once per cluster."
    ),
    beat_only: bool = typer.Option(False, help="Run only the beat scheduler (no worker)."),
    concurrency: int = typer.Option(2, help="Worker processes (prefork pool)."),
    schedule_file: str = typer.Option(
        "./celerybeat-schedule", help="Where beat keeps its last-run times."
    ),
    loglevel: str = typer.Option("info", help="Celery log level."),
) -> None:
    """Run the background jobs on Celery + Redis (settings.jobs.broker_url): lease expiry,
    cost accrual, budgets, alarms, webhooks, retention. Set ASYNCGRPO_JOBS__MODE=celery on the
    server so it does not also run them in-process."""
    settings = _settings()
    if settings.embedded:
        _fail("the embedded SQLite mode runs its jobs inside `asyncgrpo server`; use Postgres")
    _refuse_another_bucket(settings, first=False)
    from server.jobs.celery_app import app as celery_app

    if beat_only:
        celery_app.start(["beat", f"--schedule={schedule_file}", f"--loglevel={loglevel}"])
        return
    argv = ["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}"]
    if beat:
        argv += ["-B", f"--schedule={schedule_file}"]
    celery_app.worker_main(argv)


def _engine(settings) -> Any:  # type: ignore[no-untyped-def]
    """The configured database's engine; an unparsable URL or a driver that is not installed
    exits 2 with the reason (connecting happens later, where each caller names its failure)."""
    from sqlalchemy.exc import SQLAlchemyError

    from server.db import make_engine

    try:
        return make_engine(settings.database_url)
    except (SQLAlchemyError, ImportError) as exc:  # ImportError: no such driver
        _fail(f"ASYNCGRPO_DATABASE_URL is not a usable database URL ({exc})")


def _refuse_an_old_schema(settings) -> None:  # type: ignore[no-untyped-def]
    """A server needs the schema of its own release: on a database that no `asyncgrpo db
    upgrade` has brought to this code's head it exits 2 (deploy/kubernetes: server pods restart
    until the migration Job has run, then come up) instead of serving errors."""
    from sqlalchemy.exc import DBAPIError

    from server.migrate import schema_behind

    engine = _engine(settings)
    try:
        behind = schema_behind(engine)
    except DBAPIError as exc:
        _fail(f"cannot read the database ({exc.orig})")
    finally:
        engine.dispose()
    if behind is not None:
        current, head = behind
        _fail(
            f"the database schema is at {current or 'nothing (empty database)'}, this server "
            f"needs {head}: run `asyncgrpo db upgrade` first (Kubernetes: the asyncgrpo-migrate "
            "Job)"
        )


def _refuse_another_bucket(settings, *, first: bool) -> None:  # type: ignore[no-untyped-def]
    """Every process that touches the bucket checks it at start (server/bucket.py): it exists
    and is the database's. `first`: a server, which may create it and record it."""
    from server.bucket import start_refusal

    engine = _engine(settings)
    try:
        refusal = start_refusal(settings, engine, first=first)
    finally:
        engine.dispose()
    if refusal is not None:
        _fail(refusal)


def _print_first_admin_token(settings) -> None:  # type: ignore[no-untyped-def]
    from server.app import mint_first_admin_token
    from server.db import make_engine, make_sessionmaker

    engine = make_engine(settings.database_url)
    try:
        mint_first_admin_token(make_sessionmaker(engine))
    finally:
        engine.dispose()


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Upgrade the schema (under an advisory lock on Postgres)."""
    from server.migrate import upgrade

    _migrate(upgrade, revision)


@db_app.command("downgrade")
def db_downgrade(revision: str = typer.Argument(..., help="Target revision, e.g. base.")) -> None:
    """Downgrade the schema."""
    from server.migrate import downgrade

    _migrate(downgrade, revision)


def _migrate(step: Any, revision: str) -> None:
    """Run `step(engine, revision)`; an unreachable database or a bad URL or revision exits 2
    with the reason (the Kubernetes migration Job's log shows it, then the Job retries)."""
    from alembic.util.exc import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    settings = _settings()
    engine = _engine(settings)
    try:
        step(engine, revision)
    except CommandError as exc:
        _fail(f"revision {revision!r}: {exc}")
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None) or exc
        _fail(f"cannot migrate the database: {str(orig).strip().splitlines()[0]}")
    finally:
        engine.dispose()
    typer.echo(f"database at {revision}")


@admin_token_app.command("create")
def admin_token_create(name: str = typer.Option("cli", help="A label for the token.")) -> None:
    """Create an admin token and print it once."""
    from server.audit.recorder import on_the_server
    from server.db import transaction
    from server.tokens import service as tokens

    with _database() as factory, transaction(factory) as session:
        minted = tokens.mint(session, "admin", name=name)
        via = {"kind": "admin", "via": "asyncgrpo admin-token create"}
        on_the_server("token.create").record(session, None, "token", minted.token.id, detail=via)
    typer.echo(minted.plaintext)


@contextmanager
def _database() -> Iterator[Any]:
    """A session factory on the configured database (the embedded one migrated first); an
    unusable URL, a missing driver, an unreachable database or one without the schema exits 2
    with the reason instead of a traceback."""
    from alembic.util.exc import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from server.db import make_sessionmaker
    from server.migrate import upgrade

    settings = _settings()
    engine = _engine(settings)
    try:
        if settings.embedded:
            try:
                upgrade(engine)
            except CommandError as exc:  # e.g. a newer release's revision, unknown here
                _fail(f"cannot migrate the embedded database: {exc}")
        yield make_sessionmaker(engine)
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None) or exc
        reason = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        _fail(f"cannot use the database: {reason} (has `asyncgrpo db upgrade` run?)")
    finally:
        engine.dispose()


def _revoke_token(kind: str, token_id: str, force: bool) -> None:
    """Revoke a token straight in the database (works with no admin token left)."""
    import uuid

    from server.audit.recorder import on_the_server
    from server.db import transaction
    from server.errors import AppError
    from server.tokens import service as tokens

    try:
        wanted = uuid.UUID(token_id)
    except ValueError:
        _fail(f"not a token id: {token_id!r}")
    try:
        with _database() as factory, transaction(factory) as session:
            token = tokens.revoke(session, kind, wanted, force=force)
            via = {"kind": kind, "via": f"asyncgrpo {kind}-token revoke"}
            on_the_server("token.revoke").record(session, None, "token", token.id, detail=via)
            typer.echo(f"revoked {kind} token {token.prefix}… ({token.id})")
    except AppError as exc:
        _fail(exc.message)


def _list_tokens(kind: str) -> None:
    from server.db import transaction
    from server.tokens import service as tokens

    with _database() as factory, transaction(factory) as session:
        for t in tokens.list_tokens(session, kind):
            state = "revoked" if t.revoked_at else "live"
            project = f"  project {t.project.name}" if t.project is not None else ""
            typer.echo(f"{t.id}  {t.prefix}…  {state:7}  {t.name or ''}{project}")


@admin_token_app.command("list")
def admin_token_list() -> None:
    """Admin tokens: id, prefix, live or revoked, name."""
    _list_tokens("admin")


@registration_token_app.command("list")
def registration_token_list() -> None:
    """Registration tokens: id, prefix, live or revoked, name, project (none: shared)."""
    _list_tokens("registration")


@admin_token_app.command("revoke")
def admin_token_revoke(
    token_id: str = typer.Argument(..., help="The token's id (GET /api/v1/admin-tokens)."),
    force: bool = typer.Option(False, help="Revoke even the last live admin token."),
) -> None:
    """Revoke an admin token and end its dashboard sessions."""
    _revoke_token("admin", token_id, force)


@registration_token_app.command("create")
def registration_token_create(
    name: str = typer.Option(None, help="A label for the dashboard.", show_default="none"),
    ttl_hours: float = typer.Option(24.0, help="Hours until it expires (over 0, at most 8760)."),
    max_uses: int = typer.Option(1, help="Workers it may register (1 to 100,000)."),
    project: str = typer.Option(
        None,
        help="The project (name or id) whose runs its workers and pool learners serve, and "
        "only those.",
        show_default="none: shared, they serve every project",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print the whole answer as JSON, as POST /api/v1/registration-tokens gives it: "
        "id, token, prefix, expires_at, max_uses, project_id.",
        show_default="the token alone",
    ),
) -> None:
    """Create a registration token and print it once: a worker registers with it
    (asyncgrpo worker --registration-token agr_reg_…). The options are the API's body
    (POST /api/v1/registration-tokens); its id and expiry go to standard error, or all of it
    to standard output with --json. Like admin-token create it writes the server's database
    (ASYNCGRPO_DATABASE_URL), so it runs where the server's settings are."""
    from pydantic import ValidationError

    from server.audit.recorder import on_the_server
    from server.db import transaction
    from server.errors import AppError
    from server.tokens import service as tokens
    from server.tokens.schemas import RegistrationTokenCreate
    from server.wiring import wire

    try:
        body = RegistrationTokenCreate(
            name=name, ttl_hours=ttl_hours, max_uses=max_uses, project=project
        )
    except ValidationError as exc:
        _fail("; ".join(f"--{_flag(e['loc'])}: {e['msg']}" for e in exc.errors()))
    wire()  # the project's resolver (server/tokens/service.py)
    try:
        with _database() as factory, transaction(factory) as session:
            created = tokens.create_registration_token(session, body)
            via = {"kind": "registration", "via": "asyncgrpo registration-token create"}
            on_the_server("token.create").record(session, None, "token", created.id, detail=via)
    except AppError as exc:
        _fail(f"--project: {exc.message}")  # the one refusal: an unknown project
    if as_json:
        typer.echo(created.model_dump_json())
        return
    typer.echo(created.token)
    expires = created.expires_at.isoformat() if created.expires_at else "never"
    serves = f"project {body.project}" if body.project is not None else "every project (shared)"
    typer.echo(
        f"registration token {created.id}: expires {expires}, up to {created.max_uses} "
        f"worker(s), serving {serves}; shown only now",
        err=True,
    )


def _flag(loc: tuple[Any, ...]) -> str:
    return str(loc[0]).replace("_", "-") if loc else "option"


@registration_token_app.command("revoke")
def registration_token_revoke(
    token_id: str = typer.Argument(..., help="The token's id (GET /api/v1/registration-tokens)."),
) -> None:
    """Revoke a registration token: no more workers register with it."""
    _revoke_token("registration", token_id, False)


@app.command()
@settings_command(LearnerSettings, on_error=_fail)
def learner(settings: LearnerSettings) -> None:
    """Run the run's learner: attach (standby while another holds it), train, publish.
    Without --run it is a pool learner: it registers once (--registration-token; its token
    kept in --credentials-file) and trains the runs it takes, one at a time
    (docs/guides/pool-learners.md).
    Under `torchrun --nproc-per-node N` (or accelerate launch) rank 0 is the learner and the
    other ranks train their share of each step (docs/guides/data-parallel.md).
    Every option is also an environment variable: ASYNCGRPO_LEARNER_<OPTION> (learner/config.py)."""
    from learner.main import main as learner_main

    raise typer.Exit(learner_main(settings))


@app.command()
@settings_command(WorkerSettings, on_error=_fail)
def worker(settings: WorkerSettings) -> None:
    """Run a rollout worker: register once, then lease, generate and upload until stopped.
    Every option is also an environment variable: ASYNCGRPO_WORKER_<OPTION> (worker/config.py)."""
    from worker.main import main as worker_main

    raise typer.Exit(worker_main(settings))


def _owning_children(main: Callable[[], int]) -> NoReturn:
    """Run `main` (a command that starts and stops child processes: the demo, local) with
    SIGINT and SIGTERM as one KeyboardInterrupt from the start, so a Ctrl-C during its slow
    imports is not lost (asyncgrpo/interrupts.py); exits with its code, 130 when interrupted
    before it could handle it."""
    from asyncgrpo import interrupts

    interrupts.install()
    try:
        code = main()
    except KeyboardInterrupt:  # during the imports: no child started yet
        code = 130
    interrupts.forget_caught()  # the exit code is 130 after a Ctrl-C, not death by SIGINT
    raise typer.Exit(code)


@app.command()
def demo(
    workers: int = typer.Option(2, min=1, help="Rollout workers to start."),
    port: int = typer.Option(None, help="Server port (default: a free one)."),
    versions: int = typer.Option(12, min=1, help="Adapter versions to train before stopping."),
    dir: str = typer.Option("./asyncgrpo-demo", "--dir", help="Work dir: database, bucket, logs."),
    seed: int = typer.Option(
        0, min=0, max=2**31 - 1, help="Picks the prompts and the learner's seed."
    ),
) -> None:
    """Run a whole training run on this machine's CPU: the embedded server, workers and the
    learner with the small model on the arithmetic task. Ctrl-C stops every process."""

    def main() -> int:
        from pathlib import Path

        from rich.console import Console

        from asyncgrpo.demo import run_demo

        return run_demo(workers=workers, port=port, versions=versions, work_dir=Path(dir),
                        console=Console(), seed=seed)  # fmt: skip

    _owning_children(main)


@app.command()
@settings_command(LocalSettings, on_error=_fail)
def local(settings: LocalSettings) -> None:
    """Run RUN_FILE on this machine: the embedded server, the learner and --workers rollout
    workers (vLLM where the workers' Python has it, else transformers) sharing this machine's
    device, the GPU's memory split by --gpu-memory-vllm and --gpu-memory-learner; a live table,
    then a summary. Ctrl-C stops every process (docs/guides/local.md).
    Every option is also an environment variable: ASYNCGRPO_LOCAL_<OPTION>."""
    from asyncgrpo.local_config import RunFileError, load_run_file

    given = {"base_model": settings.model, "max_versions": settings.max_versions}
    try:
        config = load_run_file(settings.run_file, {k: v for k, v in given.items() if v is not None})
    except RunFileError as exc:
        _fail(str(exc))

    def main() -> int:
        from rich.console import Console

        from asyncgrpo.live_run import run_live
        from asyncgrpo.local import LocalError, prepare

        try:
            plan = prepare(settings, config)
        except LocalError as exc:
            _fail(str(exc))
        return run_live(plan, Console())

    _owning_children(main)


if __name__ == "__main__":
    app()
