"""`asyncgrpo doctor worker` and `asyncgrpo doctor learner`: the options are the worker's and
the learner's own (asyncgrpo/settings_options.py), so a host checks exactly what
`asyncgrpo worker` or `asyncgrpo learner` will run with, plus the doctor's (--json, and the
worker's --run)."""

from __future__ import annotations

from typing import NoReturn

import typer

from asyncgrpo.doctor.options import DoctorOptions, WorkerDoctorOptions
from asyncgrpo.help_layout import App
from asyncgrpo.settings_options import settings_command
from learner.config import LearnerSettings
from worker.config import WorkerSettings

doctor_app = App(
    help="Check a host before it joins: the server, the token, the bucket through the URLs "
    "the server signs, the device, the packages, the model and its fingerprint. One line per "
    "check (PASS, FAIL with the fix, SKIP); exit 1 when a check fails (docs/guides/"
    "real-run.md).",
    no_args_is_help=True,
)


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _report(host: object, options: DoctorOptions) -> None:
    from rich.console import Console

    from asyncgrpo.doctor.checks import exit_code, report
    from asyncgrpo.doctor.host import Host
    from asyncgrpo.doctor.plan import examine

    assert isinstance(host, Host)
    results = examine(host)
    report(results, host.role, as_json=options.json_output, console=Console())
    raise typer.Exit(exit_code(results))


@doctor_app.command("worker")
@settings_command(WorkerSettings, on_error=_fail, also=WorkerDoctorOptions)
def worker(settings: WorkerSettings, options: WorkerDoctorOptions) -> None:
    """Check this host as `asyncgrpo worker` with the same options would run: the token it
    will present (the token file's worker token, else --registration-token), the backend's
    device, dtype and packages, the model; with --run, the model and tokenizer fingerprint
    against that run's."""
    from asyncgrpo.doctor.host import for_worker

    _report(for_worker(settings, options.run_id), options)


@doctor_app.command("learner")
@settings_command(LearnerSettings, on_error=_fail, also=DoctorOptions)
def learner(settings: LearnerSettings, options: DoctorOptions) -> None:
    """Check this host as `asyncgrpo learner` with the same options would run: its learner
    token and run, the device, dtype and packages, the model and its tokenizer fingerprint
    against the run's."""
    from asyncgrpo.doctor.host import for_learner

    _report(for_learner(settings), options)
