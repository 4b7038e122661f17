"""Text Postgres cannot store (U+0000, unpaired surrogates) is a 422 naming the field, on every
JSON API route (found by the API fuzzer's probes: 500 from register, registration tokens, run
actions and run creation)."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from tests.conftest import mint_token


def _post(client: TestClient, url: str, raw: str, token: str) -> object:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return client.post(url, content=raw.encode(), headers=headers)


def _fields(response: object) -> list[str]:
    assert response.status_code == 422, response.text  # type: ignore[attr-defined]
    return [e["field"] for e in response.json()["errors"]]  # type: ignore[attr-defined]


def test_nul_and_surrogates_are_refused_with_the_field(client: TestClient) -> None:
    app = client.app
    admin = mint_token(app, "admin")
    registration = mint_token(app, "registration")
    url = "/api/v1/workers/register"
    assert _fields(_post(client, url, '{"name": "a\\u0000b"}', registration)) == ["name"]
    assert _fields(_post(client, url, '{"name": "a\\ud800b"}', registration)) == ["name"]
    raw = '{"name": "w", "models": ["m", "x\\u0000"]}'
    assert _fields(_post(client, url, raw, registration)) == ["models.1"]
    url = "/api/v1/registration-tokens"
    assert _fields(_post(client, url, '{"name": "\\u0000"}', admin)) == ["name"]
    config = {"name": "n\u0000", "base_model": "m", "dataset": {"kind": "generator"}}
    config["rewards"] = [{"name": "numeric_match"}]
    assert _fields(_post(client, "/api/v1/runs", json.dumps(config), admin)) == ["name"]


def test_text_that_only_looks_like_an_escape_is_stored(client: TestClient) -> None:
    registration = mint_token(client.app, "registration", max_uses=5)
    # A literal backslash followed by u0000, and a well-formed surrogate pair (an emoji).
    for raw in ('{"name": "a\\\\u0000b"}', '{"name": "\\ud83d\\ude00"}'):
        response = _post(client, "/api/v1/workers/register", raw, registration)
        assert response.status_code == 201, response.text  # type: ignore[attr-defined]
    admin = {"Authorization": f"Bearer {mint_token(client.app, 'admin')}"}
    names = {w["name"] for w in client.get("/api/v1/workers", headers=admin).json()}
    assert names == {"a\\u0000b", "\U0001f600"}
