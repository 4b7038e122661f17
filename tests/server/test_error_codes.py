"""Every error body carries a stable `code` beside `detail` (issue 26): the codes and their
statuses live in protocol/error_codes.py; every raise site in server/ names a listed code of its
own status; and every API operation answers a bad token, a bad id and a bad body with a code,
on SQLite and Postgres."""

from __future__ import annotations

import ast
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import server
from protocol.error_codes import MEANING, STATUS, ErrorCode, status_of
from server.errors import AppError, NotFound
from tests.conftest import make_settings, mint_token
from tests.server.learner.support import make_run, make_worker

SNAKE_CASE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


# -- the table ----------------------------------------------------------------------------------


def test_every_code_is_snake_case_with_one_status() -> None:
    assert set(STATUS) == set(ErrorCode)
    for code in ErrorCode:
        assert SNAKE_CASE.fullmatch(code.value), code
        assert code.name == code.value
        status = STATUS[code]
        assert status is None or 400 <= status < 600, code


def _documented(text: str) -> dict[str, str]:
    """code → status as a doc's tables say: the troubleshooting guide's `| `code` | status | when
    | what to do |` rows and docs/architecture/protocol.md's `| status | `code`, `code` |` rows."""
    found = dict(re.findall(r"^\| `(\w+)` \| (\d+|its own) \|", text, re.M))
    for status, codes in re.findall(r"^\| (\d+|the framework's own) \| (`.*`) \|$", text, re.M):
        for code in re.findall(r"`(\w+)`", codes):
            found[code] = "its own" if status == "the framework's own" else status
    return found


@pytest.mark.parametrize("doc", ["docs/guides/troubleshooting.md", "docs/architecture/protocol.md"])
def test_the_docs_list_every_code_with_its_status(doc: str) -> None:
    text = (Path(server.__file__).parents[1] / doc).read_text()
    table = {code.value: str(status or "its own") for code, status in STATUS.items()}
    assert _documented(text) == table


def test_the_troubleshooting_guide_says_what_to_do_for_every_code() -> None:
    text = (Path(server.__file__).parents[1] / "docs/guides/troubleshooting.md").read_text()
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| `")]
    advice = {cells[0].strip(" `"): cells[3].strip() for cells in rows if len(cells) == 4}
    assert set(advice) == {code.value for code in ErrorCode}
    assert all(advice.values()), [code for code, what in advice.items() if not what]
    # its "when" column is MEANING's wording (the reference page's, docs/reference/error-codes.md)
    when = {cells[0].strip(" `"): cells[2].strip() for cells in rows if len(cells) == 4}
    assert when == {code.value: MEANING[code] for code in ErrorCode}


def _error_classes() -> dict[str, type[AppError]]:
    import server.app  # noqa: F401  (imports every feature, and with it every AppError subclass)

    found: dict[str, type[AppError]] = {}
    todo: list[type[AppError]] = [AppError]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def _code_of(call: ast.Call) -> str | None:
    """The code a raise site names: `code=ErrorCode.x` or `code="x"`; None when absent or
    computed (a computed code cannot be checked here)."""
    for keyword in call.keywords:
        if keyword.arg != "code":
            continue
        value = keyword.value
        if isinstance(value, ast.BoolOp):  # `exc.code or ErrorCode.x`: the fallback is checked
            value = value.values[-1]  # here, the computed part by AppError when raised
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
            if value.value.id == "ErrorCode":
                return value.attr
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value
    return None


def _raise_sites(classes: dict[str, type[AppError]]) -> Iterator[tuple[str, str, str | None]]:
    """(where, error class, code) for every construction of an AppError class in server/."""
    root = Path(server.__file__).parent
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if isinstance(node.func, ast.Attribute):
                name = node.func.attr
            if name in classes and name != "AppError":
                yield f"{path.relative_to(root.parent)}:{node.lineno}", name, _code_of(node)


def test_every_raise_site_names_a_listed_code_of_its_status() -> None:
    classes = _error_classes()
    sites = list(_raise_sites(classes))
    assert len(sites) > 80  # the walk finds them (there are about a hundred)
    wrong = []
    for where, name, code in sites:
        if code is None or code not in ErrorCode.__members__:
            wrong.append(f"{where}: {name} without a listed code ({code})")
        elif STATUS[ErrorCode(code)] != classes[name].status_code:
            wrong.append(f"{where}: {name} is {classes[name].status_code}, {code} is not")
    assert wrong == []


def test_an_error_cannot_be_made_without_a_listed_code_of_its_status() -> None:
    with pytest.raises(TypeError):
        NotFound("run not found")  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        NotFound("run not found", code="no_such_code")
    with pytest.raises(ValueError, match="answers 409"):
        NotFound("run not found", code=ErrorCode.fencing_lost)
    refused = NotFound("run not found", code="run_not_found", field="run_id")
    assert refused.code is ErrorCode.run_not_found
    assert refused.body() == {"detail": "run not found", "code": "run_not_found", "field": "run_id"}


# -- real requests ------------------------------------------------------------------------------


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[tuple[FastAPI, TestClient]]:
    from server.app import create_app

    app = create_app(make_settings(db_url, tmp_path / "bucket"), migrate=True)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield app, client
    app.state.engine.dispose()


def _checked(response: Any, seen: dict[str, set[int]]) -> Any:
    """An error answer's body: JSON with a listed code, answered with the code's status."""
    if response.status_code < 400:
        return None
    where = f"{response.request.method} {response.request.url.path}: {response.status_code}"
    assert response.headers["content-type"].startswith("application/json"), where
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("detail"), str), (where, body)
    code = body.get("code")
    assert code in ErrorCode.__members__, (where, body)
    assert status_of(code) in (response.status_code, None), (where, body)
    seen.setdefault(code, set()).add(response.status_code)
    return body


def _operations(app: FastAPI) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method, path, operation) for every operation of the route table, from its schema."""
    for path, item in app.openapi()["paths"].items():
        for method, operation in item.items():
            yield method.upper(), path, operation


def _with_ids(path: str, operation: dict[str, Any], malformed: bool) -> str:
    for param in operation.get("parameters", []):
        if param["in"] != "path":
            continue
        if malformed:
            value = "not-an-id"
        elif param["schema"].get("format") == "uuid":
            value = str(uuid.uuid4())
        else:
            value = "12345"
        path = path.replace("{" + param["name"] + "}", value)
    return path


def test_every_operation_answers_a_code_for_a_bad_token_id_and_body(
    api: tuple[FastAPI, TestClient],
) -> None:
    app, client = api
    run = make_run(app)
    _worker_id, worker_token = make_worker(app)
    tokens = {
        "admin": mint_token(app, "admin", name="codes"),
        "learner": run.token,
        "worker": worker_token,
    }
    seen: dict[str, set[int]] = {}
    operations = list(_operations(app))
    assert len(operations) > 40
    for method, template, operation in operations:
        path = _with_ids(template, operation, malformed=False)
        if operation.get("security"):
            for headers, code in (
                ({}, "token_missing"),
                ({"Authorization": "Bearer agp_not-a-token"}, "token_invalid"),
            ):
                answer = client.request(method, path, json={}, headers=headers)
                # (the worker calls validate their body before the token)
                assert answer.status_code in (401, 422), (method, template, answer.text)
                body = _checked(answer, seen)
                assert body["code"] == (code if answer.status_code == 401 else "validation_failed")
        for token in tokens.values():
            headers = {"Authorization": f"Bearer {token}"}
            for body in ({}, {"fencing": 1}):  # (a fenced call's smallest body)
                _checked(client.request(method, path, json=body, headers=headers), seen)
            malformed = _with_ids(template, operation, malformed=True)
            _checked(client.request(method, malformed, json={}, headers=headers), seen)
            bad_body = {**headers, "Content-Type": "application/json"}
            _checked(client.request(method, path, content=b"{not json", headers=bad_body), seen)
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    _checked(client.get("/api/v1/no-such-route", headers=admin), seen)
    _checked(client.delete("/api/v1/runs", headers=admin), seen)
    expected = {
        "token_missing": {401},
        "token_invalid": {401},
        "token_kind_forbidden": {403},
        "validation_failed": {422},
        "run_not_found": {404},
        "lease_not_found": {404},
        "worker_not_found": {404},
        "dataset_not_found": {404},
        "token_not_found": {404},
        "route_not_found": {404},
        "method_not_allowed": {405},
    }
    assert {code: seen.get(code) for code in expected} == expected
    assert set(seen) <= set(ErrorCode.__members__)


def test_the_documented_error_bodies_carry_the_code(api: tuple[FastAPI, TestClient]) -> None:
    app, _client = api
    schemas = app.openapi()["components"]["schemas"]
    for model in ("ErrorBody", "BlobError"):
        assert "code" in schemas[model]["required"], model
        assert schemas[model]["properties"]["code"]["description"], model
    assert schemas["ErrorCode"]["enum"] == [code.value for code in ErrorCode]


def test_a_batch_heartbeat_answers_each_lost_lease_with_its_code(
    api: tuple[FastAPI, TestClient],
) -> None:
    app, client = api
    _worker_id, token = make_worker(app)
    lease_id = str(uuid.uuid4())
    answer = client.post(
        "/api/v1/leases/heartbeat",
        json={"leases": [{"lease_id": lease_id, "fencing": 1}]},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200, answer.text
    (result,) = answer.json()["results"]
    assert result["status"] == 404 == status_of(result["code"])
    assert result["code"] == "lease_not_found" and result["detail"] == "lease not found"


def test_an_unexpected_failure_is_a_500_with_a_code(api: tuple[FastAPI, TestClient]) -> None:
    app, client = api

    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/broken", broken)
    answer = client.get("/broken")
    assert answer.status_code == 500
    assert answer.json() == {"detail": "internal server error", "code": "internal_error"}
    assert "a bug" not in answer.text
