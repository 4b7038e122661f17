"""`asyncgrpo plan`: JSON and tables from the same arithmetic as the planner page; bad input
exits non-zero with a message naming it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from asyncgrpo.cli import app

app_cli = app

BASE = [
    "plan",
    "--model",
    "qwen2.5-1.5b",
    "--micro-batch-tokens",
    "4096",
    "--learner-gpu",
    "H100:2.5:4800",
    "--worker-gpu",
    "L4:0.35:1500",
    "--worker-gpu",
    "A10G:0.45:1300",
    "--worker-sequences",
    "32",
    "--accept-fraction",
    "0.8",
]


def test_plan_json() -> None:
    result = CliRunner().invoke(app, [*BASE, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["payload"]["lora_params"] == 18_464_768  # test_fleet_plan.py, by hand
    assert out["memory"]["single"]["total"] == pytest.approx(16.324389888)
    l4 = next(r for r in out["fleet"] if r["gpu"] == "L4")
    # test_fleet_plan.py: 4 workers, 3.9 $/h ÷ 33,750 accepted/h · 1000
    assert l4["workers"] == 4 and l4["cost_per_1000_accepted"] == pytest.approx(3.9 / 33.75)
    assert out["learner_gpu_memory_gb"] == 80


def test_plan_a_sweep() -> None:
    """--runs: a sweep with one learner per run (test_sweep_plan.py works out the figures)."""
    result = CliRunner().invoke(app, [*BASE, "--runs", "4", "--samples-per-run", "67500", "--json"])
    assert result.exit_code == 0, result.output
    sweep = json.loads(result.output)["sweep"]
    l4 = next(r for r in sweep["rows"] if r["gpu"] == "L4")
    assert (l4["learner_gpus"], l4["workers"], l4["hours"]) == (4, 16, pytest.approx(2.0))
    assert l4["cost"] == pytest.approx(31.2) and sweep["runs_by_memory"]["single"] == 216
    tables = CliRunner().invoke(app, [*BASE, "--runs", "4"])
    assert "A sweep of 4 run(s), one learner each" in tables.output
    assert "one learner GPU could hold by memory: single 216," in tables.output.replace("\n", " ")
    refused = CliRunner().invoke(app, [*BASE, "--runs", "0"])
    assert refused.exit_code == 2 and "--runs must be between 1 and 10,000" in refused.output


def test_plan_a_sweep_on_pool_learners() -> None:
    """test_sweep_plan.py works these out: 64 sequences per worker, 8 runs, 2 per H100."""
    args = [*BASE, "--worker-sequences", "64", "--runs", "8", "--samples-per-run", "67500"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    sweep = json.loads(result.output)["sweep"]
    l4 = next(r for r in sweep["rows"] if r["gpu"] == "L4")
    assert (l4["runs_per_learner"], l4["pool_learner_gpus"]) == (2, 4)
    assert l4["pool_cost_per_hour"] == pytest.approx(15.6) and l4["pool_cost"] == pytest.approx(
        62.4
    )
    assert sweep["pool_layout"] == "single"
    ckpt = json.loads(CliRunner().invoke(app, [*args, "--gradient-checkpointing", "--json"]).output)
    assert ckpt["sweep"]["pool_layout"] == "single+ckpt"
    tables = CliRunner().invoke(app, args, env={"COLUMNS": "200"}).output
    assert "The same sweep on pool learners (single layout)" in tables
    row = next(line for line in tables.splitlines() if "15.60" in line)
    assert row.split("│")[1:7] == [x.rjust(len(x)) for x in row.split("│")[1:7]]
    assert [c.strip() for c in row.split("│")[1:7]] == ["L4", "2", "4", "16", "15.60", "62.40"]


def test_plan_tables() -> None:
    result = CliRunner().invoke(app, BASE)
    assert result.exit_code == 0, result.output
    assert "Learner memory per GPU" in result.output and "fsdp+ckpt" in result.output
    assert "0.116" in result.output and "A10G" in result.output


def test_plan_from_a_config_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "vocab_size": 100,
            }
        )
    )
    result = CliRunner().invoke(app, ["plan", "--model", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["fleet"] == []  # no GPU offers: memory and payload only


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-5"], "unknown model 'gpt-5'"),
        (["--rank", "0"], "rank must be between 1 and 4096"),
        (["--targets", "mlp"], "unknown target set 'mlp'"),
        (["--worker-gpu", "L4:0.3"], "NAME:PRICE_PER_HOUR:TOKENS_PER_S"),
        (["--learner-gpu", "H100:2:x"], "must be numbers"),
        (["--accept-fraction", "0"], "--accept-fraction must be between 0.001 and 1 (got 0.0)"),
        (["--accept-fraction", "nan"], "--accept-fraction must be between 0.001 and 1"),
        (["--micro-batch-tokens", "0"], "--micro-batch-tokens must be between 1 and 100,000,000"),
        (["--micro-batch-tokens", "9" * 400], "--micro-batch-tokens must be between 1 and"),
        (["--worker-gpu", "L4:0.3"], "none measured for L4"),
        (["--from-run", "nope"], "is not a run id"),
        (["--rank", "-5"], "rank must be between 1 and 4096"),
        (["--rank", "9" * 30], "rank must be between 1 and 4096"),
        (["--link-gbps", "nan"], "link speed must be greater than 0 Gb/s"),
        (["--link-gbps", "inf"], "link speed must be greater than 0 Gb/s"),
        (["--link-gbps", "-1"], "link speed must be greater than 0 Gb/s"),
        (["--learner-gpus", "0"], "--learner-gpus must be between 1 and 4,096"),
        (["--learner-gpus", "9" * 30], "--learner-gpus must be between 1 and 4,096"),
        (["--group-size", "0"], "--group-size must be between 1 and 4,096"),
        (["--bound-groups", "-1"], "--bound-groups must be between 1 and 10,000,000"),
        (["--worker-sequences", "0"], "--worker-sequences must be between 1 and 1,000,000"),
        (["--completion-tokens", "1e308"], "--completion-tokens must be between 1 and 1,000,000"),
        (["--completion-tokens", "inf"], "--completion-tokens must be between 1 and 1,000,000"),
        (["--worker-gpu", "L4:1:1e-300"], "tokens/s must be between 0.001 and 1,000,000,000"),
        (["--worker-gpu", "L4:1e308:1"], "price must be between 0 and 10,000 USD per hour"),
    ],
)
def test_bad_input_exits_non_zero_with_a_message(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["plan", "--learner-gpu", "H100:2:100", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_the_fastest_learner_against_the_slowest_worker_is_a_plan() -> None:
    """Used to end in OverflowError (ceil of infinity): now the limits keep it finite."""
    args = ["plan", "--learner-gpu", "H100:2:1e9", "--worker-gpu", "L4:0.3:0.001", "--json"]
    result = CliRunner().invoke(app, [*args, "--accept-fraction", "0.001"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)["fleet"][0]
    assert row["bound_limited"] and row["cost_per_1000_accepted"] > 0


def test_unknown_gpu_types_plan_without_a_fits_column() -> None:
    """Any GPU name is an offer; the memory check needs a known one (case-insensitive)."""
    args = ["plan", "--worker-gpu", "MI300X:2:3000", "--json"]
    unknown = json.loads(CliRunner().invoke(app, [*args, "--learner-gpu", "TPU:1:100"]).output)
    assert unknown["learner_gpu_memory_gb"] is None and unknown["fleet"][0]["gpu"] == "MI300X"
    lower = json.loads(CliRunner().invoke(app, [*args, "--learner-gpu", "h100:1:100"]).output)
    assert lower["learner_gpu_memory_gb"] == 80


def test_help_names_what_it_plans() -> None:
    result = CliRunner().invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for words in ("fsdp+ckpt", "admission bound", "1,000 accepted", "Bad input exits 2"):
        assert words in result.output


@pytest.mark.integration  # connects to a database
@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "ASYNCGRPO_DATABASE_URL is not a database URL"),
        ("mysql://u@localhost/db", "ASYNCGRPO_DATABASE_URL is not a database URL"),
        ("postgresql+psycopg://nobody@127.0.0.1:1/x", "cannot read the server's database"),
    ],
)
def test_from_run_without_a_reachable_database_is_an_error(
    monkeypatch: pytest.MonkeyPatch, url: str, message: str
) -> None:
    from tests.conftest import TEST_SECRET

    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", url)
    monkeypatch.setenv("ASYNCGRPO_SECURITY__SECRET_KEY", TEST_SECRET)
    result = CliRunner().invoke(app, ["plan", "--from-run", "3f1b7a3e-0000-4000-8000-0000000000aa"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.integration  # a SQLite file
def test_from_run_on_an_empty_or_missing_sqlite_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """A missing SQLite file is named and not created; an unmigrated one is named too."""
    run = ["plan", "--from-run", "3f1b7a3e-0000-4000-8000-0000000000aa"]
    missing = tmp_path / "none.db"
    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", f"sqlite:///{missing}")
    result = CliRunner().invoke(app, run)
    assert result.exit_code == 2 and f"no database at {missing}" in result.output
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", f"sqlite:///{empty}")
    result = CliRunner().invoke(app, run)
    assert result.exit_code == 2 and "asyncgrpo db upgrade" in result.output


def test_worker_gpus_without_a_learner_are_refused() -> None:
    result = CliRunner().invoke(app, ["plan", "--worker-gpu", "L4:0.3:100"])
    assert result.exit_code == 2 and "need a learner GPU" in result.output


def test_plan_from_a_run(app, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """--from-run reads the server's database (ASYNCGRPO_* settings): the run's measurements
    (tests/server/dashboard/test_measured.py) fill what the options leave open."""
    import uuid

    from tests.conftest import TEST_SECRET
    from tests.server.dashboard.measured_run import make_measured_run

    run = make_measured_run(app)
    monkeypatch.setenv("ASYNCGRPO_DATABASE_URL", app.state.settings.database_url)
    monkeypatch.setenv("ASYNCGRPO_SECURITY__SECRET_KEY", TEST_SECRET)
    args = ["plan", "--from-run", str(run.id), "--learner-gpu", "H100:2.5"]
    result = CliRunner().invoke(app_cli, [*args, "--worker-gpu", "L4:0.35", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["measured"]["worker_tokens_per_s"]["L4"] == pytest.approx(50.0)
    l4 = out["fleet"][0]
    # 150 / 383.3 samples/s ÷ ((2/3) · 50 / 383.3) = 4.5: 5 needed; bound 10 · 2 = 20
    # sequences under 256 per worker: 1 usable
    assert (l4["workers_needed"], l4["workers_usable"]) == (5, 1)
    # An option given wins over the measurement: usable = bound 10 · G ÷ 4 sequences per
    # worker, 10 · 2 // 4 = 5 with the run's G, 10 · 4 // 4 = 10 with --group-size 4.
    more = [*args, "--worker-gpu", "L4:0.35", "--worker-sequences", "4", "--json"]
    measured = json.loads(CliRunner().invoke(app_cli, more).output)
    explicit = json.loads(CliRunner().invoke(app_cli, [*more, "--group-size", "4"]).output)
    assert measured["fleet"][0]["workers_usable"] == 5
    assert explicit["fleet"][0]["workers_usable"] == 10
    missing = CliRunner().invoke(app_cli, ["plan", "--from-run", str(uuid.uuid4())])
    assert missing.exit_code == 2 and "no run" in missing.output
