"""`asyncgrpo project create | list | rename` and the `--project` of `run create | list`,
`sweep create | list` and `datasets upload | list`, against a real server over HTTP
(docs/guides/projects.md): what each prints, and a refusal exiting 2 with its code and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asyncgrpo.cli import app as cli
from tests.conftest import make_settings, mint_token
from tests.harness.serve import serve_in_thread
from tests.server.datasets.files import QUESTIONS, jsonl
from tests.server.runs.conftest import EXAMPLE
from tests.server.sweeps.conftest import sweep_body

pytestmark = pytest.mark.timeout(120)


def _lines_of(output: str, name: str) -> list[str]:
    return [line for line in output.splitlines() if name in line]


def test_project_commands_and_project_options(sqlite_url: str, tmp_path: Path) -> None:
    from server.app import create_app

    application = create_app(make_settings(sqlite_url, tmp_path / "bucket"), migrate=True)
    token = mint_token(application, "admin", name="cli")
    runner = CliRunner()
    sweep_file = tmp_path / "sweep.json"
    sweep_file.write_text(json.dumps(sweep_body("lr", grid={"seed": [1, 2]})))
    data = tmp_path / "questions.jsonl"
    data.write_bytes(jsonl(QUESTIONS))
    with serve_in_thread(application) as base:
        common = ["--server", base, "--token", token]

        def invoke(*args: str, code: int = 0) -> str:
            result = runner.invoke(cli, [*args, *common], env={"COLUMNS": "160"})
            assert result.exit_code == code, result.output
            return result.output

        made = invoke("project", "create", "team-a")
        project_id = made.split()[1]
        assert made.split()[2] == "team-a"
        taken = invoke("project", "create", "team-a", code=2)
        assert "409 project_name_taken" in taken and "(field: name)" in taken
        bad = invoke("project", "create", "Team_A", code=2)
        assert "422 validation_failed" in bad

        run = invoke("run", "create", str(EXAMPLE), "--project", "team-a")
        assert "project team-a" in run and "--token agr_lrn_" in run
        invoke("run", "create", str(EXAMPLE))  # in default
        unknown = invoke("run", "create", str(EXAMPLE), "--project", "nope", code=2)
        assert "422 unknown_project" in unknown and "(field: project)" in unknown
        of_team = invoke("run", "list", "--project", project_id)
        assert len(_lines_of(of_team, "team-a")) == 1 and "default" not in of_team
        assert len(invoke("run", "list").strip().splitlines()) == 2

        sweep = invoke("sweep", "create", str(sweep_file), "--project", "team-a")
        assert "2 runs (project team-a)" in sweep
        swept = invoke("sweep", "list", "--project", "team-a")
        assert len(_lines_of(swept, "team-a")) == 1
        assert invoke("sweep", "list", "--project", "default").strip() == ""

        uploaded = invoke("datasets", "upload", str(data), "--project", "team-a")
        assert "project: team-a" in uploaded
        listed = invoke("datasets", "list", "--project", "team-a")
        assert len(_lines_of(listed, "questions.jsonl")) == 1
        assert invoke("datasets", "list", "--project", "default").strip() == ""
        refused = invoke("datasets", "upload", str(data), "--project", "nope", code=2)
        assert "422: project nope not found (code: unknown_project, field: project)" in refused

        projects = invoke("project", "list")
        rows = {line.split("│")[1].strip(): line for line in projects.splitlines() if "│" in line}
        assert rows["team-a"].split("│")[3].strip() == "3"  # one run, and the sweep's two
        assert rows["default"].split("│")[3].strip() == "1"
        as_json = json.loads(invoke("project", "list", "--json"))
        assert {p["name"]: p["runs"] for p in as_json} == {"default": 1, "team-a": 3}

        renamed = invoke("project", "rename", "team-a", "team-b")
        assert f"project {project_id}  team-a -> team-b" in renamed
        by_id = invoke("project", "rename", project_id, "team-c")
        assert "-> team-c" in by_id
        missing = invoke("project", "rename", "team-a", "team-d", code=2)
        assert "no project has the name or id 'team-a'" in missing
        onto = invoke("project", "rename", "team-c", "default", code=2)
        assert "409 project_name_taken" in onto
        names = [p["name"] for p in json.loads(invoke("project", "list", "--json"))]
        assert names == ["default", "team-c"]


def test_project_token_commands(sqlite_url: str, tmp_path: Path) -> None:
    """`asyncgrpo project token create | list | revoke`: the minted token works with the run
    commands in its project only, a bad role exits 2 naming `role`, a revoked one is 401."""
    from server.app import create_app

    application = create_app(make_settings(sqlite_url, tmp_path / "bucket"), migrate=True)
    admin = mint_token(application, "admin", name="cli")
    runner = CliRunner()
    with serve_in_thread(application) as base:

        def invoke(*args: str, token: str = admin, code: int = 0) -> str:
            argv = [*args, "--server", base, "--token", token]
            result = runner.invoke(cli, argv, env={"COLUMNS": "160"})
            assert result.exit_code == code, result.output
            return result.output

        invoke("project", "create", "team-a")
        made = invoke("project", "token", "create", "team-a", "--role", "ci", "--name", "ci-main")
        ci = made.split()[0]
        assert ci.startswith("agr_prj_") and "(ci of team-a" in made
        bad = invoke(
            "project", "token", "create", "team-a", "--role", "boss", "--name", "x", code=2
        )
        assert "422 validation_failed" in bad and "role" in bad
        unknown = invoke("project", "token", "list", "team-z", code=2)
        assert "team-z" in unknown
        run = invoke("run", "create", str(EXAMPLE), token=ci)
        assert "project team-a" in run
        invoke("run", "create", str(EXAMPLE))  # the admin's, in default
        assert len(invoke("run", "list", token=ci).strip().splitlines()) == 1
        listed = json.loads(invoke("project", "token", "list", "team-a", "--json"))
        assert [(t["name"], t["role"]) for t in listed] == [("ci-main", "ci")]
        revoked = invoke("project", "token", "revoke", "team-a", listed[0]["id"])
        assert "revoked agr_prj_" in revoked and "(ci)" in revoked
        refused = invoke("run", "list", token=ci, code=2)
        assert "401 token_revoked" in refused
