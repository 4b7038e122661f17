"""docs/reference/http-api.md: the HTTP API as the app's own OpenAPI document describes it, one
table per tag: method and path, summary and description, auth, request body, responses."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from itertools import groupby
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from asyncgrpo.docs_reference.markdown import cell, code, page, table

HEADERS = ("Operation", "Summary", "Auth", "Request body", "Responses")
METHODS = ("get", "put", "post", "patch", "delete", "head", "options")
UNTAGGED = "other"


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if schema.get("type") == "array" and "items" in schema:
        return _schema_name(schema["items"]) + "[]"
    if "anyOf" in schema or "oneOf" in schema:
        return " | ".join(_schema_name(s) for s in schema.get("anyOf") or schema["oneOf"])
    return str(schema.get("type") or "any")


def _content(content: dict[str, Any]) -> str:
    """`Name` for a JSON schema, the media type for anything else; media types sorted."""
    parts = []
    for media, body in sorted(content.items()):
        schema = body.get("schema") or {}
        if media == "application/json" and schema:
            parts.append(code(_schema_name(schema)))
        else:
            parts.append(code(media))
    return ", ".join(parts)


def request_body(operation: dict[str, Any]) -> str:
    body = operation.get("requestBody")
    return _content(body.get("content") or {}) or "—" if body else "—"


def responses(operation: dict[str, Any]) -> str:
    """Statuses grouped by what they answer: `200` `RunOut`; `401`, `403` `ErrorBody`."""
    answered = [
        (status, _content(r.get("content") or {}))
        for status, r in sorted(operation.get("responses", {}).items())
    ]
    groups: dict[str, list[str]] = {}
    for status, body in answered:
        groups.setdefault(body, []).append(status)
    return "; ".join(
        ", ".join(code(s) for s in statuses) + (f" {body}" if body else "")
        for body, statuses in groups.items()
    )


def _token(name: str, scheme: dict[str, Any]) -> str:
    """`admin token` for the bearer scheme `AdminToken` (one per token kind), `bearer token` for
    another bearer scheme, else the scheme's type."""
    kind = scheme.get("scheme") or scheme.get("type") or name
    if kind != "bearer":
        return str(kind)
    if name.endswith("Token") and name != "Token":
        return f"{name.removesuffix('Token').lower()} token"
    return "bearer token"


def auth(operation: dict[str, Any], schemes: dict[str, Any]) -> str:
    """The token the operation's security schemes take (`admin token`), or `open`."""
    names = sorted({name for req in operation.get("security") or [] for name in req})
    if not names:
        return "open"
    return ", ".join(_token(name, schemes.get(name, {})) for name in names)


def summary(operation: dict[str, Any]) -> str:
    title = cell(operation.get("summary"))
    about = cell(operation.get("description"))
    return f"**{title}**: {about}" if title and about else title or about


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(tag, method, path, operation), sorted by tag, path and method."""
    found = []
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            if method in METHODS:
                tag = (operation.get("tags") or [UNTAGGED])[0]
                found.append((tag, path, METHODS.index(method), method, operation))
    for tag, path, _, method, operation in sorted(found, key=lambda f: f[:3]):
        yield tag, method, path, operation


def sections(document: dict[str, Any]) -> Iterator[str]:
    schemes = document.get("components", {}).get("securitySchemes", {})
    for tag, ops in groupby(operations(document), key=lambda o: o[0]):
        rows = [
            (
                code(f"{method.upper()} {path}"),
                summary(op),
                auth(op, schemes),
                request_body(op),
                responses(op),
            )
            for _, method, path, op in ops
        ]
        yield f"## {tag}\n"
        yield table(HEADERS, rows)


def undescribed(document: dict[str, Any]) -> list[str]:
    """Operations whose handler has no docstring (FastAPI's summary is only its name)."""
    return [
        f"{method.upper()} {path}"
        for _, method, path, op in operations(document)
        if not (op.get("description") or "").strip()
    ]


def openapi_document() -> dict[str, Any]:
    """The app's OpenAPI document under the default settings; the environment is not read, and
    the app is built on a throwaway folder (nothing is migrated or connected)."""
    from server.app import create_app
    from server.config import Settings

    class Defaults(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings,)  # the defaults, whatever the environment says

    with tempfile.TemporaryDirectory() as folder:
        settings = Defaults(
            database_url=f"sqlite:///{folder}/openapi.db",
            bucket_url=f"{folder}/bucket",
            security={"secret_key": "x" * 32},  # never used: no request is served
            print_admin_token=False,
            jobs={"mode": "celery"},
        )
        app = create_app(settings, migrate=False)
        document: dict[str, Any] = app.openapi()
        return document


INTRO = """
Every operation of the control plane's HTTP API, read from its OpenAPI document (served at
`/openapi.json`, interactive at `/docs`). Bodies are JSON unless a media type is named; every
error answer is an `ErrorBody` (`detail` for people, `code` for programs: see
[the error codes](error-codes.md)). *Auth* names the kind of token an operation takes, sent as
`Authorization: Bearer …`: an admin, registration, worker or learner token (each kind is its own
security scheme in the OpenAPI document); a token of another kind is refused with 403. The host
checks (`doctor`) take a token of any kind. `open` operations take none.
"""


def render(document: dict[str, Any] | None = None) -> str:
    document = document if document is not None else openapi_document()
    info = document.get("info", {})
    intro = INTRO + f"\nAPI {code(str(info.get('title')))} {code(str(info.get('version')))}.\n"
    return page("HTTP API", intro, list(sections(document)))


def missing_descriptions(document: dict[str, Any] | None = None) -> list[str]:
    return undescribed(document if document is not None else openapi_document())
