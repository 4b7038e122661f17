"""Local process orchestration for `asyncgrpo demo` and the end-to-end tests.

A `Cluster` starts the control plane (embedded SQLite + local bucket by default, or a given
Postgres URL and S3 bucket), creates an admin token, a run and a registration token, then starts
rollout workers and the learner as subprocesses with one torch thread each. Every process runs
in its own process group (its own session), so a Ctrl-C on the terminal reaches only the
orchestrator, which then stops each group: SIGTERM, a grace period, then SIGKILL. Each child is
started through `parent_death.py`, so it is killed when the orchestrator dies, SIGKILL included
(Linux), and it is started inside `interrupts.deferred()`, so an interrupt never lands between
its fork and the record of its handle.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from asyncgrpo import interrupts
from protocol.client import AsyncGrpoClient

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
PARENT_DEATH = Path(__file__).resolve().with_name("parent_death.py")
SERVER_SHUTDOWN_S = 2
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def process_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment without ASYNCGRPO_* settings (each process gets its own),
    keeping the model cache; the package root on PYTHONPATH (a source checkout works too)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ASYNCGRPO_") or k == "ASYNCGRPO_MODEL_CACHE"
    }
    paths = [str(PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(ONE_THREAD)
    env.update(extra)
    return env


def dies_with_this_process(argv: list[str]) -> list[str]:
    """`argv` run through parent_death.py: it keeps its pid and is killed when this process
    dies. Linux only (the parent-death signal); elsewhere `argv` as it is, and a killed parent
    can leave it running."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-I", str(PARENT_DEATH), str(os.getpid()), *argv]


class ManagedProcess:
    """One subprocess in its own process group, its output in a log file; it dies with the
    process (the thread) that started it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path, log: Path):
        self.name, self.argv, self.env, self.cwd, self.log_path = name, argv, env, cwd, log
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> ManagedProcess:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            dies_with_this_process(self.argv),
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def send_signal(self, sig: int) -> None:
        """`sig` to the process itself, not its group (as a spot notice or `kill` sends it)."""
        assert self.proc is not None, f"{self.name} was never started"
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        """Its exit code, once it has exited (subprocess.TimeoutExpired after `timeout_s`)."""
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.wait(timeout=timeout_s)

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill9(self) -> None:
        """SIGKILL the whole group and reap it (a crash: no cleanup runs)."""
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the group, wait up to `grace_s`, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal_group(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.proc.wait()
        # the leader is gone; anything it left in its group goes too
        self.signal_group(signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def stop_all(procs: list[ManagedProcess], grace_s: float) -> None:
    """SIGTERM every group at once, wait up to `grace_s` in all, then SIGKILL what is left."""
    for proc in procs:
        if proc.alive():
            proc.signal_group(signal.SIGCONT)
            proc.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.stop(max(0.1, deadline - time.monotonic()))


def worker_process(
    name: str,
    state: Path,
    server: tuple[str, str],
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    log: Path | None = None,
) -> ManagedProcess:
    """The `asyncgrpo worker` process `name` (not started) for `server` (its URL and a
    registration token): its token file, adapter cache and work dir under `state`, its output in
    `log` (`state`/worker.log); `args` follow the CLI's own, `env` adds settings, `python` runs
    it (another venv's interpreter, e.g. vLLM's)."""
    state.mkdir(parents=True, exist_ok=True)
    url, registration_token = server
    full_env = process_env(
        {
            "ASYNCGRPO_WORKER_TOKEN_FILE": str(state / "token.json"),
            "ASYNCGRPO_WORKER_ADAPTER_CACHE_DIR": str(state / "adapters"),
            "ASYNCGRPO_WORKER_WORK_DIR": str(state / "batches"),
            **(env or {}),
        }
    )
    argv = [
        python or sys.executable, "-m", "asyncgrpo.cli", "worker", "--server", url,
        "--registration-token", registration_token, "--name", name, *args,
    ]  # fmt: skip
    return ManagedProcess(name, argv, full_env, state, log or state / "worker.log")


@dataclass
class ClusterConfig:
    """Where and how to run. Without `database_url` the server is embedded (SQLite file and a
    bucket folder under `work_dir`); with it, `bucket_url`/`s3` configure the store."""

    work_dir: Path
    port: int | None = None
    database_url: str | None = None
    bucket_url: str | None = None
    s3: dict[str, str] = field(default_factory=dict)
    secret_key: str | None = None
    server_env: dict[str, str] = field(default_factory=dict)
    worker_env: dict[str, str] = field(default_factory=dict)
    learner_env: dict[str, str] = field(default_factory=dict)
    model: str = "smollm2-135m-instruct"
    threads: int = 1
    server_log_level: str = "warning"
    worker_python: str | None = None  # e.g. .venv-vllm/bin/python for the vllm backend


class Cluster:
    """Server, workers and learner of one run on this machine."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.dir = config.work_dir.resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self.port = config.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: ManagedProcess | None = None
        self.workers: dict[str, ManagedProcess] = {}
        self.learner: ManagedProcess | None = None
        self.admin_token: str | None = None
        self.admin: AsyncGrpoClient | None = None
        self.run_id: str | None = None
        self.learner_token: str | None = None
        self.registration_token: str | None = None

    # -- settings -------------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        return self.config.database_url or f"sqlite:///{self.dir / 'asyncgrpo.db'}"

    @property
    def bucket_location(self) -> str:
        """The bucket as the server is given it: a local folder or an s3:// URL."""
        return (self.config.bucket_url or str(self.dir / "bucket")).rstrip("/")

    def server_env(self) -> dict[str, str]:
        c = self.config
        env = {
            "ASYNCGRPO_DATABASE_URL": self.database_url,
            "ASYNCGRPO_BUCKET_URL": self.bucket_location,
            "ASYNCGRPO_PUBLIC_URL": self.url,
            "ASYNCGRPO_PRINT_ADMIN_TOKEN": "false",
        }
        if c.secret_key:
            env["ASYNCGRPO_SECURITY__SECRET_KEY"] = c.secret_key
        env.update({f"ASYNCGRPO_S3__{k.upper()}": v for k, v in c.s3.items()})
        env.update(c.server_env)
        return env

    def _settings(self) -> Any:
        from server.config import Settings

        saved = dict(os.environ)
        try:
            os.environ.update(self.server_env())
            return Settings()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    # -- control plane --------------------------------------------------------------------------

    def prepare_database(self) -> str:
        """Migrate (embedded mode) and mint an admin token directly in the database."""
        from server.db import make_engine, make_sessionmaker, transaction
        from server.migrate import upgrade
        from server.tokens import service as tokens

        settings = self._settings()
        engine = make_engine(settings.database_url)
        try:
            if settings.embedded:
                upgrade(engine)
            with transaction(make_sessionmaker(engine)) as session:
                self.admin_token = tokens.mint(session, "admin", name="cluster").plaintext
        finally:
            engine.dispose()
        return self.admin_token

    def start_server(self, timeout_s: float = 120.0) -> None:
        """`uvicorn server.main:app` on 127.0.0.1:port (cwd = work dir), waits for /healthz."""
        if self.admin_token is None:
            self.prepare_database()
        argv = [
            sys.executable, "-m", "uvicorn", "server.main:app", "--host", "127.0.0.1",
            "--port", str(self.port), "--log-level", self.config.server_log_level,
            # on SIGTERM, cancel the calls still open after this long (long-polls of clients
            # that were stopped first) instead of waiting them out
            "--timeout-graceful-shutdown", str(SERVER_SHUTDOWN_S),
            # the peer's own address, never one read from a header: the audit log reads
            # X-Forwarded-For itself, from trusted proxies only (server/audit/source.py)
            "--no-proxy-headers",
        ]  # fmt: skip
        env = process_env(self.server_env())
        log = self.dir / "logs" / "server.log"
        with interrupts.deferred():
            self.server = ManagedProcess("server", argv, env, self.dir, log).start()
        self.wait_healthy(timeout_s)
        if self.admin is None:
            self.admin = AsyncGrpoClient(self.url, self.admin_token)

    def wait_healthy(self, timeout_s: float) -> None:
        assert self.server is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            interrupts.check()
            if not self.server.alive():
                raise RuntimeError(f"server exited:\n{self.server.log_text()[-4000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not healthy after {timeout_s}s")

    def restart_server(self, down_s: float = 0.0, timeout_s: float = 120.0) -> None:
        assert self.server is not None
        self.server.stop()
        time.sleep(down_s)
        self.start_server(timeout_s)

    def create_run(self, run_config: dict[str, Any], registration_uses: int = 16) -> str:
        assert self.admin is not None, "start the server first"
        created = self.admin.create_run(run_config)
        self.run_id = str(created["run"]["id"])
        self.learner_token = str(created["learner_token"])
        token = self.admin.create_registration_token(
            name="cluster", max_uses=registration_uses, ttl_hours=24.0
        )
        self.registration_token = str(token["token"])
        return self.run_id

    # -- workers and learner --------------------------------------------------------------------

    def _cli(self) -> list[str]:
        return [sys.executable, "-m", "asyncgrpo.cli"]

    def start_worker(self, name: str) -> ManagedProcess:
        """Start (or restart, reusing its token file) the worker `name`."""
        assert self.registration_token is not None, "create the run first"
        proc = worker_process(
            name,
            self.dir / "workers" / name,
            (self.url, self.registration_token),
            ["--model", self.config.model, "--threads", str(self.config.threads)],
            self.config.worker_env,
            self.config.worker_python,
            self.dir / "logs" / f"{name}.log",
        )
        with interrupts.deferred():
            self.workers[name] = proc.start()
        return proc

    def wait_worker_ready(self, name: str, timeout_s: float) -> None:
        """Until the worker `name` logs that its engine is up (worker/main.py, READY_LOG);
        RuntimeError (with its log's end) when it exits first, TimeoutError after `timeout_s`."""
        from worker.main import READY_LOG

        proc = self.workers[name]
        deadline = time.monotonic() + timeout_s
        while READY_LOG not in proc.log_text():
            interrupts.check()
            if not proc.alive():
                tail = proc.log_text()[-3000:]
                raise RuntimeError(f"worker {name} exited ({proc.returncode()}):\n{tail}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {name} not ready after {timeout_s:.0f}s")
            time.sleep(0.5)

    def start_learner(
        self,
        command: Sequence[str] | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> ManagedProcess:
        """Start (or restart, in the same work dir) the learner. `command` replaces
        `asyncgrpo learner` (a wrapper that takes the learner's arguments, e.g. torchrun);
        `args` follow the learner's own; `env` is added to the config's learner_env."""
        assert self.run_id is not None and self.learner_token is not None
        env = process_env({**self.config.learner_env, **(env or {})})
        argv = [
            *(command or [*self._cli(), "learner"]), "--server", self.url, "--run", self.run_id,
            "--token", self.learner_token, "--model", self.config.model,
            "--threads", str(self.config.threads), "--work-dir", str(self.dir / "learner"), *args,
        ]  # fmt: skip
        log = self.dir / "logs" / "learner.log"
        with interrupts.deferred():
            self.learner = ManagedProcess("learner", argv, env, self.dir, log).start()
        return self.learner

    def processes(self) -> list[ManagedProcess]:
        procs = [*self.workers.values(), self.learner, self.server]
        return [p for p in procs if p is not None]

    def stop(self, grace_s: float = 10.0) -> None:
        """Workers and learner together (workers release their leases), then the server."""
        stop_all([*self.workers.values(), *([self.learner] if self.learner else [])], grace_s)
        if self.admin is not None:
            self.admin.close()
        if self.server is not None:
            self.server.stop(grace_s)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
