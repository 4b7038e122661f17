"""The symptom table (server/dashboard/symptoms.py): every drift alarm the banner shows has its
entry, every setting it tells a user to change exists (a run-config field, or an option of the
worker or the learner), and the banner on the run page shows the table's advice."""

from __future__ import annotations

import re
import types
import uuid
from typing import Any, Union, get_args, get_origin

import pytest
import typer
from fastapi.testclient import TestClient
from markupsafe import escape
from pydantic import BaseModel

from asyncgrpo.cli import app as cli
from protocol.run_config import AlarmConfig, RunConfig
from server.dashboard.service import DRIFT_KINDS
from server.dashboard.symptoms import BY_ALARM, SYMPTOMS
from server.db import transaction
from server.models import MetricPoint
from tests.server.dashboard.test_pages import _form, login


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if get_origin(annotation) in (Union, types.UnionType):
        models = [a for a in get_args(annotation) if isinstance(a, type)]
        annotation = next((a for a in models if issubclass(a, BaseModel)), None)
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_model else None


def _run_config_field(path: str) -> bool:
    model: type[BaseModel] | None = RunConfig
    for part in path.split("."):
        if model is None or part not in model.model_fields:
            return False
        model = _model_of(model.model_fields[part].annotation)
    return True


def _options(command: str) -> set[str]:
    group: Any = typer.main.get_command(cli)
    params = group.commands[command].params
    return {o for p in params for o in (*p.opts, *p.secondary_opts)}


def test_every_drift_alarm_has_its_advice() -> None:
    assert set(DRIFT_KINDS) <= set(BY_ALARM)
    assert len({s.key for s in SYMPTOMS}) == len(SYMPTOMS)


def test_every_alarm_named_is_one_of_the_run_configs_alarms() -> None:
    fields = AlarmConfig.model_fields
    for alarm in BY_ALARM:
        assert any(f == alarm or f.startswith(alarm + "_") for f in fields), alarm


@pytest.mark.parametrize("symptom", SYMPTOMS, ids=lambda s: s.key)
def test_every_setting_to_change_exists(symptom: Any) -> None:
    assert symptom.figures and symptom.changes
    for setting in symptom.settings:
        command, _, option = setting.partition(" ")
        if command in ("worker", "learner"):
            assert option in _options(command), setting
        else:
            assert _run_config_field(setting), setting


def test_the_run_pages_banner_shows_the_tables_advice(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    """A clip fraction over the run's threshold (0.2): the banner says what the table says."""
    csrf = login(client, admin_token)
    created = client.post("/runs/new", data={**_form(), "csrf_token": csrf})
    run_id = uuid.UUID(re.search(r"--run ([0-9a-f-]{36})", created.text).group(1))  # type: ignore[union-attr]
    values = {"clip_low": 0.2, "clip_high": 0.1, "reward_mean": 0.5}
    with transaction(app.state.sessionmaker) as session:
        session.add(MetricPoint(run_id=run_id, source="learner", step=0, version=0, values=values))
    page = client.get(f"/runs/{run_id}").text
    banner = page.split('data-alarm="clip_fraction"')[1].split("</div>")[0]
    advice = BY_ALARM["clip_fraction"]
    assert str(escape(advice.meaning)) in banner
    assert "Settings that change it: " + ", ".join(advice.settings) in banner
    assert 'data-alarm="stale_waste"' not in page
