"""docs/reference/settings.md: every setting of the server, the worker and the learner, with the
environment variables pydantic-settings reads for it (protocol/settings_env.py derives them from
each model's env_prefix, env_nested_delimiter and aliases)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from asyncgrpo.docs_reference.fields import default_label, type_label
from asyncgrpo.docs_reference.markdown import cell, code, first_paragraph, page, table
from protocol.settings_env import env_prefix, field_variables

ROOT = "ASYNCGRPO_"
HEADERS = ("Setting", "Environment variable", "Type", "Default", "Description")


@dataclass(frozen=True)
class Group:
    """A model's fields as one table: the root's own, or a nested group's (`name` set)."""

    name: str | None
    description: str
    model: type[BaseModel]
    rows: list[tuple[str, ...]]


def _prefix_first(variables: list[str], prefix: str) -> list[str]:
    """The part's own names first, then the project's (ASYNCGRPO_OUTBOUND_…), then the bare
    field name that aliases also read."""
    return sorted(variables, key=lambda v: (not v.startswith(prefix), not v.startswith(ROOT)))


def _row(name: str, field: FieldInfo, variables: list[str]) -> tuple[str, ...]:
    return (
        code(name),
        ", ".join(code(v) for v in variables),
        cell(type_label(field.annotation)),
        default_label(name, field, none="None"),
        cell(field.description),
    )


def _nested_variables(
    settings: type[BaseSettings], group: str, model: type[BaseModel], sub: str, field: FieldInfo
) -> list[str]:
    """What a nested group's field is read from: its own settings' names, or the root's prefix,
    the group, the nested delimiter and the field (ASYNCGRPO_S3__ENDPOINT_URL)."""
    if issubclass(model, BaseSettings):
        return _prefix_first(field_variables(model, sub, field), env_prefix(model))
    delimiter = settings.model_config.get("env_nested_delimiter")
    if delimiter:
        return [f"{env_prefix(settings)}{group}{delimiter}{sub}".upper()]
    return [f"{env_prefix(settings)}{group}".upper()]  # only as a key of the group's JSON


def nested_model(field: FieldInfo) -> type[BaseModel] | None:
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def groups(settings: type[BaseSettings]) -> list[Group]:
    """The root's fields, then one group per nested model field, in declaration order."""
    prefix = env_prefix(settings)
    own: list[tuple[str, ...]] = []
    nested: list[Group] = []
    for name, field in settings.model_fields.items():
        model = nested_model(field)
        if model is None:
            variables = _prefix_first(field_variables(settings, name, field), prefix)
            own.append(_row(name, field, variables))
            continue
        rows = [
            _row(sub, sub_field, _nested_variables(settings, name, model, sub, sub_field))
            for sub, sub_field in model.model_fields.items()
        ]
        nested.append(Group(name, field.description or "", model, rows))
    root = Group(None, first_paragraph(settings.__doc__), settings, own)
    return [root, *nested]


def undescribed(settings: type[BaseSettings]) -> list[str]:
    """Fields (nested groups' included) with no description: `Settings.s3.region`."""
    missing = []
    for name, field in settings.model_fields.items():
        if not (field.description or "").strip():
            missing.append(f"{settings.__name__}.{name}")
        model = nested_model(field)
        for sub, sub_field in (model.model_fields if model else {}).items():
            if not (sub_field.description or "").strip():
                missing.append(f"{settings.__name__}.{name}.{sub}")
    return missing


def section(title: str, source: str, settings: type[BaseSettings]) -> Iterator[str]:
    """One part's settings: `## title`, its own table, then `### group` per nested group."""
    root, *nested = groups(settings)
    delimiter = settings.model_config.get("env_nested_delimiter")
    how = f"Environment prefix {code(env_prefix(settings))}"
    how += f", nested groups joined by {code(delimiter)}" if delimiter else ""
    yield f"## {title}\n\n{cell(root.description)}\n\nIn {code(source)}. {how}.\n"
    yield table(HEADERS, root.rows)
    for group in nested:
        about = _once(group.description, first_paragraph(group.model.__doc__))
        yield f"### {code(group.name or '')}\n\n{cell(about)}\n"
        yield table(HEADERS, group.rows)


def _once(*sentences: str) -> str:
    """The sentences, each said once (a group's description often repeats its class's)."""
    seen: list[str] = []
    for sentence in sentences:
        if sentence and sentence.rstrip(".") not in (s.rstrip(".") for s in seen):
            seen.append(sentence)
    return " ".join(seen)


INTRO = """
Every setting of the three processes, of `asyncgrpo local`, and the options `asyncgrpo doctor`
adds to the worker's or the learner's, read from their pydantic-settings models. A setting
comes from its environment variable (any of those listed; the names are case-insensitive) or,
for the worker, the learner, `local` and `doctor`, from the command-line option of the same name
(`asyncgrpo worker --gpu-type`, see [the CLI reference](cli.md)), which wins over the
environment. A list or a dict is given as JSON. An unknown variable under a part's prefix is
refused at start, naming the closest setting.
"""


def _parts() -> list[tuple[str, str, type[BaseSettings]]]:
    from asyncgrpo.doctor.options import WorkerDoctorOptions
    from asyncgrpo.local_config import LocalSettings
    from learner.config import LearnerSettings
    from server.config import Settings
    from worker.config import WorkerSettings

    return [
        ("Server", "server/config.py", Settings),
        ("Worker", "worker/config.py", WorkerSettings),
        ("Learner", "learner/config.py", LearnerSettings),
        ("asyncgrpo local", "asyncgrpo/local_config.py", LocalSettings),
        # beside the worker's or the learner's own (--run: `asyncgrpo doctor worker` only)
        ("Doctor", "asyncgrpo/doctor/options.py", WorkerDoctorOptions),
    ]


def render() -> str:
    sections = [s for title, source, model in _parts() for s in section(title, source, model)]
    return page("Settings", INTRO, sections)


def missing_descriptions() -> list[str]:
    return [m for _title, _source, model in _parts() for m in undescribed(model)]
