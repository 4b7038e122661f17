"""/api/v1/projects on Postgres and SQLite (docs/guides/projects.md): admins create, list, read
and rename projects; names are lowercase slugs and unique; runs and sweeps take a project (name
or id, `default` without one), show it and are listed by it."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from server.models.project import DEFAULT_PROJECT_ID
from tests.conftest import mint_token
from tests.server.runs.conftest import example_config
from tests.server.sweeps.conftest import sweep_body

pytestmark = pytest.mark.timeout(120)

URL = "/api/v1/projects"


def _create(client: TestClient, admin: dict[str, str], name: str) -> dict[str, object]:
    answer = client.post(URL, json={"name": name}, headers=admin)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def test_create_list_get_rename(runs_client: TestClient, admin: dict[str, str]) -> None:
    made = _create(runs_client, admin, "team-a")
    listed = runs_client.get(URL, headers=admin).json()
    assert [p["name"] for p in listed] == ["default", "team-a"]
    assert listed[0]["id"] == str(DEFAULT_PROJECT_ID)
    one = runs_client.get(f"{URL}/{made['id']}", headers=admin)
    assert one.status_code == 200 and one.json()["name"] == "team-a"
    renamed = runs_client.patch(f"{URL}/{made['id']}", json={"name": "team-b"}, headers=admin)
    assert renamed.status_code == 200, renamed.text
    assert renamed.json() == {**made, "name": "team-b"}
    assert runs_client.get(f"{URL}/{made['id']}", headers=admin).json()["name"] == "team-b"
    same = runs_client.patch(f"{URL}/{made['id']}", json={"name": "team-b"}, headers=admin)
    assert same.status_code == 200


def test_a_taken_name_is_409_and_nothing_changes(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    made = _create(runs_client, admin, "team-a")
    again = runs_client.post(URL, json={"name": "team-a"}, headers=admin)
    assert again.status_code == 409
    assert again.json()["code"] == "project_name_taken" and again.json()["field"] == "name"
    onto = runs_client.patch(f"{URL}/{made['id']}", json={"name": "default"}, headers=admin)
    assert onto.status_code == 409 and onto.json()["code"] == "project_name_taken"
    names = [p["name"] for p in runs_client.get(URL, headers=admin).json()]
    assert names == ["default", "team-a"]


@pytest.mark.parametrize("name", ["", "Team", "-a", "a_b", "a b", "a" * 64, "é", "a/b"], ids=repr)
def test_a_bad_name_is_422_naming_the_field(
    runs_client: TestClient, admin: dict[str, str], name: str
) -> None:
    answer = runs_client.post(URL, json={"name": name}, headers=admin)
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "validation_failed"
    assert any(e["field"] == "name" for e in answer.json()["errors"]), answer.json()


def test_longest_name_and_digits_first_are_accepted(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    _create(runs_client, admin, "a" * 63)
    _create(runs_client, admin, "9-lives")


def test_unknown_project_is_404(runs_client: TestClient, admin: dict[str, str]) -> None:
    for answer in (
        runs_client.get(f"{URL}/{uuid.uuid4()}", headers=admin),
        runs_client.patch(f"{URL}/{uuid.uuid4()}", json={"name": "x"}, headers=admin),
    ):
        assert answer.status_code == 404 and answer.json()["code"] == "project_not_found"


def test_no_token_is_401_and_a_non_admin_token_is_refused(
    runs_app, runs_client: TestClient
) -> None:  # type: ignore[no-untyped-def]
    assert runs_client.get(URL).status_code == 401
    assert runs_client.post(URL, json={"name": "x"}).status_code == 401
    registration = {"Authorization": f"Bearer {mint_token(runs_app, 'registration')}"}
    answer = runs_client.post(URL, json={"name": "x"}, headers=registration)
    assert answer.status_code == 403 and answer.json()["code"] == "token_kind_forbidden"
    assert runs_client.get(URL, headers=registration).status_code == 403


def test_runs_take_a_project_by_name_or_id_and_are_listed_by_it(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    team = _create(runs_client, admin, "team-a")
    plain = runs_client.post("/api/v1/runs", json=example_config(name="p"), headers=admin)
    assert plain.status_code == 201, plain.text
    assert plain.json()["run"]["project"] == "default"
    assert plain.json()["run"]["project_id"] == str(DEFAULT_PROJECT_ID)
    by_name = runs_client.post(
        "/api/v1/runs?project=team-a", json=example_config(name="n"), headers=admin
    )
    by_id = runs_client.post(
        f"/api/v1/runs?project={team['id']}", json=example_config(name="i"), headers=admin
    )
    for answer in (by_name, by_id):
        assert answer.status_code == 201, answer.text
        assert answer.json()["run"]["project"] == "team-a"
    listed = runs_client.get("/api/v1/runs?project=team-a", headers=admin).json()
    assert sorted(r["name"] for r in listed) == ["i", "n"]
    assert {r["project"] for r in listed} == {"team-a"}
    everything = runs_client.get("/api/v1/runs", headers=admin).json()
    assert sorted(r["name"] for r in everything) == ["i", "n", "p"]
    shown = runs_client.get(f"/api/v1/runs/{plain.json()['run']['id']}", headers=admin).json()
    assert shown["project"] == "default"
    counted = {p["name"]: p["runs"] for p in runs_client.get(URL, headers=admin).json()}
    assert counted == {"default": 1, "team-a": 2}


def test_an_unknown_project_is_422_naming_it_and_makes_nothing(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    made = runs_client.post("/api/v1/runs?project=nope", json=example_config(), headers=admin)
    assert made.status_code == 422
    assert made.json()["code"] == "unknown_project" and made.json()["field"] == "project"
    listed = runs_client.get("/api/v1/runs?project=nope", headers=admin)
    assert listed.status_code == 422 and listed.json()["code"] == "unknown_project"
    sweep = runs_client.post("/api/v1/sweeps", json=sweep_body(project="nope"), headers=admin)
    assert sweep.status_code == 422 and sweep.json()["code"] == "unknown_project"
    assert runs_client.get("/api/v1/runs", headers=admin).json() == []
    assert runs_client.get("/api/v1/sweeps", headers=admin).json() == []


def test_a_sweep_and_its_runs_are_in_its_project(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    _create(runs_client, admin, "team-a")
    made = runs_client.post("/api/v1/sweeps", json=sweep_body(project="team-a"), headers=admin)
    assert made.status_code == 201, made.text
    assert made.json()["sweep"]["project"] == "team-a"
    runs = runs_client.get("/api/v1/runs?project=team-a", headers=admin).json()
    assert len(runs) == 4 and {r["sweep_id"] for r in runs} == {made.json()["sweep"]["id"]}
    plain = runs_client.post("/api/v1/sweeps", json=sweep_body(name="d"), headers=admin)
    assert plain.json()["sweep"]["project"] == "default"
    of_team = runs_client.get("/api/v1/sweeps?project=team-a", headers=admin).json()
    assert [s["id"] for s in of_team] == [made.json()["sweep"]["id"]]
