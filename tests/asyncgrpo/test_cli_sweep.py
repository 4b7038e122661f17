"""`asyncgrpo sweep create | list | show | pause | resume | cancel` against a real server over
HTTP (docs/guides/sweeps.md): the learner credentials written once with mode 0600, the table of
runs, the actions on every run, and a refused sweep exiting 2 with the combination named."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from asyncgrpo.cli import app as cli
from tests.conftest import make_settings, mint_token
from tests.harness.serve import serve_in_thread
from tests.server.sweeps.conftest import sweep_body

pytestmark = pytest.mark.timeout(120)


def test_sweep_commands(sqlite_url: str, tmp_path: Path) -> None:
    from server.app import create_app

    application = create_app(make_settings(sqlite_url, tmp_path / "bucket"), migrate=True)
    token = mint_token(application, "admin", name="cli")
    spec = tmp_path / "sweep.json"
    spec.write_text(json.dumps(sweep_body("lr-rank")))
    env_file = tmp_path / "learners.env"
    runner = CliRunner()
    with serve_in_thread(application) as base:
        common = ["--server", base, "--token", token]
        created = runner.invoke(
            cli, ["sweep", "create", str(spec), "--learner-env", str(env_file), *common]
        )
        assert created.exit_code == 0, created.output
        sweep_id = created.output.split()[1]
        assert "4 runs" in created.output and "agr_lrn_" not in created.output
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        lines = env_file.read_text().splitlines()
        assert lines[0] == "# lr-rank grpo.learning_rate=1e-05 lora.rank=8"
        pairs = [dict(v.split("=", 1) for v in line.split()) for line in lines[1::2]]
        assert len(pairs) == 4 and all(
            p["ASYNCGRPO_LEARNER_TOKEN"].startswith("agr_lrn_") for p in pairs
        )
        # each line's token is its run's learner token: the doctor call says whose it is
        for p in pairs:
            seen = httpx.get(
                f"{base}/api/v1/doctor/token",
                headers={"Authorization": f"Bearer {p['ASYNCGRPO_LEARNER_TOKEN']}"},
            ).json()
            assert (seen["kind"], seen["run_id"]) == ("learner", p["ASYNCGRPO_LEARNER_RUN_ID"])

        # the file is never overwritten: its tokens are shown once
        again = runner.invoke(
            cli, ["sweep", "create", str(spec), "--learner-env", str(env_file), *common]
        )
        assert again.exit_code == 2 and "exists" in again.output
        assert (
            len(
                httpx.get(
                    f"{base}/api/v1/sweeps", headers={"Authorization": f"Bearer {token}"}
                ).json()
            )
            == 1
        )

        listed = runner.invoke(cli, ["sweep", "list", *common])
        assert listed.exit_code == 0, listed.output
        assert (
            sweep_id in listed.output and "4 runs" in listed.output and "4 pending" in listed.output
        )

        shown = runner.invoke(cli, ["sweep", "show", sweep_id, *common], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, shown.output
        for heading in (
            "overrides",
            "status",
            "version",
            "last reward",
            "eval accuracy",
            "stale waste",
            "spend $",
        ):
            assert heading in shown.output, shown.output
        assert "lora.rank=32" in shown.output and "grpo.learning_rate=3e-05" in shown.output
        assert shown.output.count("pending") == 4
        as_json = runner.invoke(cli, ["sweep", "show", sweep_id, "--json", *common])
        assert [r["status"] for r in json.loads(as_json.output)["runs"]] == ["pending"] * 4

        paused = runner.invoke(cli, ["sweep", "pause", sweep_id, "--reason", "lunch", *common])
        assert paused.exit_code == 0, paused.output
        assert "pause: 4 moved, 0 left as they were" in paused.output
        paused_again = runner.invoke(cli, ["sweep", "pause", sweep_id, *common])
        assert "pause: 0 moved, 4 left" in paused_again.output
        assert "invalid_transition" in paused_again.output
        resumed = runner.invoke(cli, ["sweep", "resume", sweep_id, *common])
        assert "resume: 4 moved" in resumed.output
        cancelled = runner.invoke(cli, ["sweep", "cancel", sweep_id, *common])
        assert "cancel: 4 moved" in cancelled.output
        shown = runner.invoke(cli, ["sweep", "show", sweep_id, "--json", *common])
        assert [r["status"] for r in json.loads(shown.output)["runs"]] == ["cancelled"] * 4

        # without --learner-env the credentials are printed, once
        spec.write_text(json.dumps(sweep_body("one", grid={"seed": [1]})))
        printed = runner.invoke(cli, ["sweep", "create", str(spec), *common])
        assert printed.exit_code == 0, printed.output
        assert "ASYNCGRPO_LEARNER_TOKEN=agr_lrn_" in printed.output

        # a refused sweep: exit 2 naming the combination and the field; nothing made
        spec.write_text(json.dumps(sweep_body("bad", grid={"lora.rank": [8, 4096]})))
        bad_env = tmp_path / "bad.env"
        refused = runner.invoke(
            cli, ["sweep", "create", str(spec), "--learner-env", str(bad_env), *common]
        )
        assert refused.exit_code == 2
        assert "422 sweep_combination_invalid: combination 1 (lora.rank=4096)" in refused.output
        assert "(field: lora.rank)" in refused.output and not bad_env.exists()
        unknown = runner.invoke(
            cli, ["sweep", "show", "00000000-0000-0000-0000-000000000000", *common]
        )
        assert unknown.exit_code == 2 and "404 sweep_not_found" in unknown.output
