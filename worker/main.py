"""`asyncgrpo worker`: parse settings (before torch or vLLM is imported), load the backend,
run the loop in a thread, and turn SIGTERM/SIGINT into "release the lease and exit" within
`shutdown_grace_s` (< 5 s)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from worker.config import WorkerSettings
from worker.registration import RegistrationRefused, obtain_credentials
from worker.state import StateInUse, StateLock

if TYPE_CHECKING:
    from worker.backends.base import Backend
    from worker.credentials import Credentials
    from worker.loop import WorkerLoop

log = logging.getLogger("worker")


def make_backend(settings: WorkerSettings) -> Backend:
    """Import and start the configured engine (this is where torch / vLLM get imported)."""
    from worker.capabilities import generation_dtype

    dtype = generation_dtype(settings)
    if settings.dtype == "auto":
        log.info("--dtype auto: generating in %s", dtype)
    if settings.backend == "vllm":
        from worker.backends.vllm import VllmBackend

        return VllmBackend(settings.model, settings.vllm, dtype=dtype)
    if settings.backend == "simulated":
        from worker.backends.simulated import SimulatedBackend

        return SimulatedBackend(settings.model, settings.simulated)
    from worker.backends.transformers import TransformersBackend

    return TransformersBackend(
        settings.model,
        dtype=dtype,
        device=settings.device,
        num_threads=settings.num_threads,
        max_batch_sequences=settings.max_batch_sequences,
        max_loaded_adapters=settings.max_loaded_adapters,
    )


def build_loop(
    settings: WorkerSettings, backend: Backend, credentials: Credentials | None = None
) -> WorkerLoop:
    from worker.loop import WorkerLoop
    from worker.prompts import PromptEncoder

    encoder = PromptEncoder(backend.tokenizer)
    return WorkerLoop(
        settings,
        backend,
        fingerprint=encoder.fingerprint(),
        encoder=encoder,
        credentials=credentials,
    )


def credentials_before_the_model(settings: WorkerSettings) -> Credentials:
    """The worker's credentials, got before the model loads (a refused token costs no load)."""
    from protocol.client import AsyncGrpoClient
    from protocol.environments import EnvironmentAllowlist

    def new_client(token: str | None) -> AsyncGrpoClient:
        return AsyncGrpoClient(
            settings.server_url,
            token,
            timeout_s=settings.http_timeout_s,
            max_retries=2,
            retry_cap_s=2.0,
        )

    environments = EnvironmentAllowlist.discover(settings.environment_modules).names()
    return obtain_credentials(
        settings, environments=environments, stop=threading.Event(), new_client=new_client
    )


def serve(loop: WorkerLoop, grace_s: float) -> int:
    """Run `loop` in a thread; on SIGTERM/SIGINT stop it and give it `grace_s` to release."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.warning("signal %d: releasing the held leases and stopping", signum)
        stop.set()
        loop.request_stop()

    errors: list[BaseException] = []

    def run() -> None:
        try:
            loop.run()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    thread = threading.Thread(target=run, name="worker-loop", daemon=True)
    thread.start()
    try:
        while thread.is_alive() and not stop.is_set():
            thread.join(timeout=0.2)
        if stop.is_set():
            thread.join(timeout=grace_s)
            if thread.is_alive():  # stuck in a call: release from here, then leave
                loop.release_all("shutdown (loop did not stop in time)", timeout_s=1.0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if errors:
        log.error("worker loop failed", exc_info=errors[0])
        return 1
    return 0


def _close_quickly(backend: Backend, timeout_s: float) -> None:
    """Close the engine (vLLM: its processes) but never wait longer than `timeout_s`."""
    closer = threading.Thread(target=backend.close, name="backend-close", daemon=True)
    closer.start()
    closer.join(timeout_s)


# Logged once the engine is up (vLLM: its memory profiled, its KV cache allocated): `asyncgrpo
# local` starts the next process on a shared GPU only after it (asyncgrpo/live_run.py).
READY_LOG = "backend ready in"


def main(settings: WorkerSettings, *, hard_exit: bool = True) -> int:
    """Run the worker until stopped. With `hard_exit`, the process ends with os._exit once the
    lease is released: tearing down torch at interpreter exit can take seconds, and a
    preempted box has only a few."""
    logging.basicConfig(
        level=os.environ.get("ASYNCGRPO_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    state = StateLock(settings.token_file)
    try:
        state.acquire()  # held for the process's life
        credentials = credentials_before_the_model(settings)
    except (StateInUse, RegistrationRefused) as exc:
        state.release()
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while the server could not be reached
        state.release()
        return 130
    started = time.monotonic()
    backend = make_backend(settings)
    log.info("%s %s %.1fs", backend.name, READY_LOG, time.monotonic() - started)
    code = 1
    try:
        code = serve(build_loop(settings, backend, credentials), settings.shutdown_grace_s)
    finally:
        state.release()
        _close_quickly(backend, 1.0)
        log.info("worker exiting (%d)", code)
        if hard_exit:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code
