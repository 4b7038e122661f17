"""The doctor's own options, beside the worker's or the learner's settings (which it takes
whole, so that a host checks exactly what it will run with)."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DoctorOptions(BaseSettings):
    """The doctor's own options.

    Under the environment prefix ASYNCGRPO_DOCTOR_."""

    # populate_by_name: the command line passes json_output=… / run_id=…; the aliases are the
    # only environment names (no bare JSON_OUTPUT or RUN_ID is read)
    model_config = SettingsConfigDict(
        env_prefix="ASYNCGRPO_DOCTOR_", extra="forbid", populate_by_name=True
    )

    json_output: bool = Field(
        False,
        validation_alias=AliasChoices("ASYNCGRPO_DOCTOR_JSON"),
        description="Print the checks as one JSON object ({ok, role, checks: [{name, status, "
        "detail, fix}]}) instead of one line each (--json; ASYNCGRPO_DOCTOR_JSON).",
    )


class WorkerDoctorOptions(DoctorOptions):
    """The doctor's own options.

    A worker serves no one run, so the run to compare its model with is named here."""

    run_id: str | None = Field(
        None,
        validation_alias=AliasChoices("ASYNCGRPO_DOCTOR_RUN", "ASYNCGRPO_DOCTOR_RUN_ID"),
        description="A run this worker is meant to serve (UUID): its base model and tokenizer "
        "fingerprint must be this host's (--run; ASYNCGRPO_DOCTOR_RUN or "
        "ASYNCGRPO_DOCTOR_RUN_ID). Without it the fingerprint check is skipped.",
    )
