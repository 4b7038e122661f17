"""The environment variable names a pydantic-settings model reads, and the refusal of unknown
names under its prefix (a typo is otherwise silently ignored). One implementation for the
server, the worker and the learner."""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection, Mapping

from pydantic import AliasChoices, AliasPath, BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

# Server settings whose names begin with the worker's or the learner's prefix
# (tests/server/test_config.py checks this against server/config.py, which worker/ and learner/
# never import): the worker and the learner leave them alone.
SERVER_NAMES_UNDER_PART_PREFIXES = frozenset({"ASYNCGRPO_LEARNER_LEASE_TTL_S"})


def env_prefix(settings: type[BaseSettings]) -> str:
    return str(settings.model_config.get("env_prefix") or "").upper()


def field_variables(settings: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The names pydantic-settings reads for one field: its alias choices (whole names, the
    prefix does not apply to them), else the prefix and the field's name."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c.upper() for c in alias.choices if isinstance(c, str)]
    if isinstance(alias, str):
        return [alias.upper()]
    if isinstance(alias, AliasPath):
        return [str(alias.path[0]).upper()]
    return [f"{env_prefix(settings)}{name}".upper()]


def setting_variables(settings: type[BaseSettings]) -> list[str]:
    """Every name the settings read: their fields', and a nested group's fields (a settings
    group under its own prefix, a model one level down with `env_nested_delimiter`); a group's
    own name (a JSON object of the whole group) is not one of them."""
    delimiter = settings.model_config.get("env_nested_delimiter")
    names: list[str] = []
    for name, field in settings.model_fields.items():
        group = field.annotation
        if isinstance(group, type) and issubclass(group, BaseSettings):
            names += setting_variables(group)
        elif isinstance(group, type) and issubclass(group, BaseModel) and delimiter:
            prefix = f"{env_prefix(settings)}{name}{delimiter}".upper()
            names += [f"{prefix}{sub}".upper() for sub in group.model_fields]
        else:
            names += field_variables(settings, name, field)
    return names


def unknown_variables(
    environ: Mapping[str, str],
    settings: type[BaseSettings],
    *,
    what: str,
    ignore_prefixes: tuple[str, ...] = (),
    ignore_names: Collection[str] = (),
    retired: Mapping[str, str] | None = None,
) -> list[str]:
    """A message for each variable under the settings' prefix that is no setting, naming the
    closest setting when one is close. `what`: "a worker setting (worker/config.py)";
    `retired`: settings that are gone, each with what to do instead."""
    prefix = env_prefix(settings)
    delimiter = settings.model_config.get("env_nested_delimiter")
    known = setting_variables(settings)
    suggestions = [k for k in known if k.startswith(prefix)]
    messages = []
    for raw in sorted(environ):
        name = raw.upper()
        if not name.startswith(prefix) or name in known or name in ignore_names:
            continue
        if retired and name in retired:
            messages.append(f"{raw} is gone: {retired[name]}")
            continue
        if name.startswith(ignore_prefixes):
            continue
        # deeper nesting (ASYNCGRPO_DASHBOARD__ON_DEMAND_PRICES__H100) sets a dict's key
        if delimiter and delimiter.join(name.split(delimiter)[:2]) in known:
            continue
        close = difflib.get_close_matches(name, suggestions, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        messages.append(f"{raw} is not {what}{hint}")
    return messages


def refuse_unknown_part_variables(settings: type[BaseSettings], what: str) -> None:
    """ValueError naming each unknown variable of a part's prefix (worker, learner) and its
    closest setting; the server's own variables under those prefixes are not the part's."""
    unknown = unknown_variables(
        os.environ, settings, what=what, ignore_names=SERVER_NAMES_UNDER_PART_PREFIXES
    )
    if unknown:
        raise ValueError("; ".join(unknown))
