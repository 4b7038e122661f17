"""Every ASYNCGRPO_* variable the deploy files set is a real setting, and the values parse: the
server's (server/config.py, which itself refuses an unknown name) and the worker's
(worker/config.py, which would silently ignore a misspelt ASYNCGRPO_WORKER_* name, hence the
explicit name check)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from protocol.settings_env import setting_variables
from server.config import Settings, unknown_variables
from tests.deploy.manifests import SKYPILOT, all_objects, containers, env_names
from worker.config import WorkerSettings

SERVER_OBJECTS = ("asyncgrpo-settings", "asyncgrpo-secrets")
WORKER_OBJECTS = ("asyncgrpo-worker-settings", "asyncgrpo-worker-registration")


def worker_variables() -> set[str]:
    """What WorkerSettings reads: its fields and aliases, and its nested groups' (own prefix)."""
    return set(setting_variables(WorkerSettings))


def _values(names: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for obj in all_objects():
        if obj["metadata"]["name"] in names:
            out.update(obj.get("data", {}))
            out.update(obj.get("stringData", {}))
    return out


def _worker_pod_env() -> dict[str, str]:
    sts = next(o for o in all_objects() if o["kind"] == "StatefulSet")
    env: dict[str, str] = {}
    for entry in containers(sts)[0]["env"]:  # fieldRef/secretKeyRef: a stand-in value
        env[entry["name"]] = entry.get("value", "asyncgrpo-worker-0")
    return env


def _set(monkeypatch: pytest.MonkeyPatch, env: dict[str, Any]) -> None:
    for name, value in env.items():
        if value is not None:
            monkeypatch.setenv(name, str(value))


def test_server_variables_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _values(SERVER_OBJECTS)
    assert "ASYNCGRPO_DATABASE_URL" in env and "ASYNCGRPO_JOBS__BROKER_URL" in env
    assert unknown_variables(env) == []
    # The placeholder is too short on purpose: no cluster runs on a key printed in the repo.
    assert env["ASYNCGRPO_SECURITY__SECRET_KEY"] == "CHANGE-ME"
    with pytest.raises(ValueError, match="at least 32 characters"):
        _set(monkeypatch, env)
        Settings()
    _set(monkeypatch, {**env, "ASYNCGRPO_SECURITY__SECRET_KEY": "k" * 48})
    settings = Settings()
    assert settings.jobs.mode == "celery" and not settings.embedded


def test_worker_variables_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**_values(WORKER_OBJECTS), **_worker_pod_env()}
    asyncgrpo = {n for n in env if n.startswith("ASYNCGRPO_")}
    assert asyncgrpo - worker_variables() == set()
    _set(monkeypatch, env)
    settings = WorkerSettings()
    assert settings.name == "asyncgrpo-worker-0" and settings.backend == "vllm"
    assert str(settings.token_file) == env["ASYNCGRPO_WORKER_TOKEN_FILE"]


def test_every_manifest_variable_is_checked() -> None:
    """No object outside the four above sets ASYNCGRPO_* names the two tests would miss."""
    checked = {*SERVER_OBJECTS, *WORKER_OBJECTS, "asyncgrpo-worker"}
    for obj in all_objects():
        names = {n for n in env_names(obj) if n.startswith("ASYNCGRPO_")}
        if names:
            assert obj["metadata"]["name"] in checked, obj["metadata"]["name"]


def test_skypilot_variables_are_worker_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    task = yaml.safe_load(SKYPILOT.read_text())
    names = {*task["envs"], *task.get("secrets", {})}
    assert names - worker_variables() == set()
    assert {n for n in names if not n.startswith("ASYNCGRPO_WORKER_")} == set()
    k8s = set(_values(WORKER_OBJECTS))
    assert (
        k8s
        - {
            "ASYNCGRPO_WORKER_TOKEN_FILE",
            "ASYNCGRPO_WORKER_ADAPTER_CACHE_DIR",
            "ASYNCGRPO_WORKER_WORK_DIR",
        }
        <= names
    )  # the same settings, paths aside
    _set(monkeypatch, {**task["envs"], "ASYNCGRPO_WORKER_REGISTRATION_TOKEN": "agr_reg_x"})
    assert WorkerSettings().backend == "vllm"


def test_a_misspelt_worker_variable_is_caught() -> None:
    assert "ASYNCGRPO_WORKER_SHUTDOWN_GRACE" not in worker_variables()
    assert "ASYNCGRPO_WORKER_VLLM_MAX_MODEL_LEN" in worker_variables()
