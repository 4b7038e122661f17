from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.config import RETIRED_SETTINGS, Settings, setting_variables


def test_embedded_default_needs_no_configuration(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for var in ("ASYNCGRPO_DATABASE_URL", "ASYNCGRPO_BUCKET_URL", "ASYNCGRPO_SECURITY__SECRET_KEY"):
        monkeypatch.delenv(var, raising=False)
    settings = Settings()
    assert settings.embedded
    assert settings.database_url == "sqlite:///./asyncgrpo.db"
    key = settings.secret_key()
    assert len(key) >= 32 and settings.secret_key() == key  # persisted, stable
    assert (tmp_path / "asyncgrpo.secret").stat().st_mode & 0o777 == 0o600


def test_production_refuses_missing_secret(monkeypatch):
    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", "postgresql+psycopg://x@h/db")
    monkeypatch.delenv("ASYNCGRPO_SECURITY__SECRET_KEY", raising=False)
    with pytest.raises(ValidationError, match="SECRET_KEY must be set"):
        Settings()


def test_short_secret_is_refused(monkeypatch):
    monkeypatch.setenv("ASYNCGRPO_SECURITY__SECRET_KEY", "short")
    with pytest.raises(ValidationError, match="at least 32"):
        Settings()


def test_nested_settings_from_environment(monkeypatch):
    monkeypatch.setenv("ASYNCGRPO_BUCKET_URL", "s3://my-bucket/prefix")
    monkeypatch.setenv("ASYNCGRPO_S3__ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("ASYNCGRPO_S3__PATH_STYLE", "true")
    settings = Settings()
    assert settings.s3.endpoint_url == "http://127.0.0.1:9000" and settings.s3.path_style


def test_every_settings_field_is_described():
    def walk(model):  # type: ignore[no-untyped-def]
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann)

    walk(Settings)


def test_outbound_policy_from_environment(monkeypatch):
    monkeypatch.delenv("ASYNCGRPO_OUTBOUND_ALLOW_PRIVATE", raising=False)
    monkeypatch.delenv("ASYNCGRPO_OUTBOUND_ALLOW_CIDRS", raising=False)
    strict = Settings().outbound_policy()
    assert strict.refusal("10.20.1.1") is not None and strict.refusal("127.0.0.1") is not None
    monkeypatch.setenv("ASYNCGRPO_OUTBOUND_ALLOW_CIDRS", '["10.20.0.0/16"]')
    some = Settings().outbound_policy()
    assert some.refusal("10.20.1.1") is None and some.refusal("127.0.0.1") is not None
    monkeypatch.setenv("ASYNCGRPO_OUTBOUND_ALLOW_PRIVATE", "true")
    assert Settings().outbound_policy().refusal("127.0.0.1") is None
    monkeypatch.setenv("ASYNCGRPO_OUTBOUND_ALLOW_CIDRS", '["10.20.0.0/33"]')
    with pytest.raises(ValidationError, match="is not a network"):
        Settings()


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("ASYNCGRPO_S3_PUBLIC_ENDPOINT", "ASYNCGRPO_S3__ENDPOINT_URL"),
        ("ASYNCGRPO_SECRET_KEY", "ASYNCGRPO_SECURITY__SECRET_KEY"),
        ("ASYNCGRPO_DATABASE_ULR", "ASYNCGRPO_DATABASE_URL"),
        ("asyncgrpo_jobs__mode_", "ASYNCGRPO_JOBS__MODE"),
    ],
)
def test_an_unknown_server_variable_is_refused_with_the_closest_name(monkeypatch, name, suggestion):
    monkeypatch.setenv(name, "x")
    with pytest.raises(ValidationError) as caught:
        Settings()
    message = str(caught.value)
    assert f"{name} is not a server setting" in message
    assert f"did you mean {suggestion}?" in message


def test_other_parts_variables_and_real_settings_are_accepted(monkeypatch):
    for name in (
        "ASYNCGRPO_WORKER_SERVER_URL",  # the worker's own prefix
        "ASYNCGRPO_WORKER_ANYTHING",
        "ASYNCGRPO_LEARNER_RUN_ID",
        "ASYNCGRPO_MODEL_CACHE",
        "ASYNCGRPO_LOG_LEVEL",
        "ASYNCGRPO_TEST_PG_ADMIN_URL",
        "ASYNCGRPO_BENCH_PG",
        "ASYNCGRPO_BENCH_PG_URL",
    ):
        monkeypatch.setenv(name, "x")
    # No server setting is named under the worker's prefix any more; the learner's holds one.
    monkeypatch.setenv("ASYNCGRPO_LEARNER_LEASE_TTL_S", "45")  # a server setting
    monkeypatch.setenv("ASYNCGRPO_DASHBOARD__ON_DEMAND_PRICES__H100", "5.5")
    monkeypatch.setenv("ASYNCGRPO_JOBS__SWEEP_INTERVAL_S", "3")
    settings = Settings()
    assert settings.learner_lease_ttl_s == 45.0
    assert settings.dashboard.on_demand_prices["h100"] == 5.5
    assert settings.jobs.sweep_interval_s == 3.0


def test_a_wrong_value_of_a_part_named_server_setting_is_still_checked(monkeypatch):
    monkeypatch.setenv("ASYNCGRPO_LEARNER_LEASE_TTL_S", "perhaps")
    with pytest.raises(ValidationError, match="learner_lease_ttl_s"):
        Settings()


@pytest.mark.parametrize("name", sorted(RETIRED_SETTINGS))
@pytest.mark.parametrize("value", ["false", "true", "8"])
def test_a_retired_setting_is_refused_by_name(monkeypatch, name, value):
    """A setting that is gone (server/config.py RETIRED_SETTINGS) is refused, naming it and
    saying it is gone and what to do instead, whatever its value: never silently ignored, and
    not taken for a typo."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    message = str(caught.value)
    assert f"{name} is gone: {RETIRED_SETTINGS[name]}" in message
    assert f"{name} is not a server setting" not in message


def test_the_event_loop_switch_is_retired_and_no_retired_setting_is_read():
    assert "ASYNCGRPO_WORKER_CALLS_ON_EVENT_LOOP" in RETIRED_SETTINGS
    assert not set(RETIRED_SETTINGS) & set(setting_variables())


def test_the_parts_know_the_server_settings_under_their_prefixes():
    """protocol/settings_env.py names them for the worker and the learner, which never import
    server/config.py: the list is this one."""
    from protocol.settings_env import SERVER_NAMES_UNDER_PART_PREFIXES
    from server.config import FOREIGN_ENV_PREFIXES, setting_variables

    under = {n for n in setting_variables() if n.startswith(FOREIGN_ENV_PREFIXES)}
    assert under == SERVER_NAMES_UNDER_PART_PREFIXES
