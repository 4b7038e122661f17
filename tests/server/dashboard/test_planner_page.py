"""The planner page's fleet and memory tables, rendered by the real app (TestClient, no
browser): full page and the HTMX fragment, and a bad field answered in the fragment."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from tests.server.dashboard.test_pages import login

QUERY = (
    "/planner?model=qwen2.5-1.5b&rank=16&targets=all-linear&link_gbps=1&learner_gpus=4"
    "&micro_batch_tokens=4096&learner_gpu=H100:2.5:4800&worker_gpus=L4:0.35:1500,A10G:0.45:1300"
    "&completion_tokens=512&group_size=8&bound_groups=16"
    "&worker_sequences=32&accept_fraction=0.8"
)


def _cells(html: str, table_id: str) -> list[list[str]]:
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in body.split("<tr>")[2:]]


def test_planner_page_shows_memory_and_fleet(client: TestClient, admin_token: str) -> None:
    login(client, admin_token)
    page = client.get(QUERY)
    assert page.status_code == 200 and "<html" in page.text
    memory = {row[0]: row for row in _cells(page.text, "plan-memory")}
    # test_fleet_plan.py works these out by hand: 16.32 GB on one GPU without checkpointing.
    assert memory["single"][5] == "16.32" and memory["single"][6] == "yes"
    assert set(memory) == {"single", "single+ckpt", "fsdp", "fsdp+ckpt"}
    fleet = {row[0]: row for row in _cells(page.text, "plan-fleet")}
    # 4 L4 workers (test_fleet_plan.py), 4 learner GPUs: (4 · 0.35 + 4 · 2.5) $/h ÷ 33,750
    # accepted/h · 1000 = 0.338 $.
    assert fleet["L4"][4] == "4" and fleet["L4"][7] == "0.338"
    assert "A10G" in fleet
    # runs=1: the sweep table is one run's fleet; the memory table says the runs an H100 holds
    sweep = {row[0]: row for row in _cells(page.text, "plan-sweep")}
    assert sweep["L4"][1:4] == ["4", "4", "11.40"]
    assert memory["single"][7] == "216"  # test_sweep_plan.py
    four = client.get(QUERY + "&runs=4&samples_per_run=67500")
    sweep = {row[0]: row for row in _cells(four.text, "plan-sweep")}
    # 4 runs × (4 L4 · 0.35 + 4 H100 · 2.5) $/h; 67,500 samples at 33,750/h: 2 h, 91.20 $
    assert sweep["L4"][1:7] == ["16", "16", "45.60", "135,000", "2.00", "91.20"]
    assert sweep["L4"][7] == "1.00"
    # 4 learner GPUs: a pool learner runs on one, so no pool figures
    pool = {row[0]: row for row in _cells(four.text, "plan-pool")}
    assert pool["L4"][1:3] == ["—", "—"]
    # one learner GPU, 64 sequences per worker, 8 runs (test_sweep_plan.py): 2 runs per H100,
    # 4 of them, 15.60 $/h, 62.40 $; with checkpointing the single+ckpt layout
    one_gpu = QUERY.replace("learner_gpus=4", "learner_gpus=1").replace(
        "worker_sequences=32", "worker_sequences=64"
    )
    pooled = client.get(one_gpu + "&runs=8&samples_per_run=67500")
    pool = {row[0]: row for row in _cells(pooled.text, "plan-pool")}
    assert pool["L4"][1:6] == ["2", "4", "16", "15.60", "62.40"]
    assert "in the single layout" in pooled.text
    ckpt = client.get(one_gpu + "&runs=8&gradient_checkpointing=on")
    assert "in the single+ckpt layout" in ckpt.text and 'value="on" checked' in ckpt.text
    fragment = client.get(QUERY, headers={"HX-Request": "true"})
    assert "<html" not in fragment.text and 'id="plan-fleet"' in fragment.text


def test_planner_page_names_a_bad_field(client: TestClient, admin_token: str) -> None:
    login(client, admin_token)
    for query, message in (
        (QUERY.replace("worker_gpus=L4:0.35:1500", "worker_gpus=L4:x:1"), "must be numbers"),
        (QUERY.replace("micro_batch_tokens=4096", "micro_batch_tokens=lots"), "micro batch tokens"),
        (QUERY.replace("accept_fraction=0.8", "accept_fraction=2"), "accept_fraction"),
    ):
        r = client.get(query, headers={"HX-Request": "true"})
        assert r.status_code == 200 and message in r.text and 'id="plan-fleet"' not in r.text


def test_fill_from_a_run(client: TestClient, app, admin_token: str) -> None:  # type: ignore[no-untyped-def]
    """The run's measurements (test_measured.py) fill the fields; NAME:PRICE offers use the
    measured tokens/s: learner 150 completion tokens/s ÷ 383.3 = 0.391 samples/s; one L4
    (2/3) · 50 / 383.3 = 0.0870: 4.5 → 5 workers (bound 10 groups · 2 = 20 sequences, 32 per
    worker: 1 usable, so 1, bound-limited)."""
    from tests.server.dashboard.measured_run import make_measured_run

    run = make_measured_run(app)
    login(client, admin_token)
    page = client.get(
        f"/planner?from_run={run.id}&fill=1&learner_gpu=H100:2.5&worker_gpus=L4:0.35"
        "&worker_sequences=32"
    )
    assert page.status_code == 200
    assert 'id="plan-measured"' in page.text and "L4 50 tokens/s" in page.text
    assert 'name="group_size" type="number" min="1" step="1" value="2"' in page.text
    assert 'value="0.667"' in page.text and 'value="383.3"' in page.text
    fleet = {row[0]: row for row in _cells(page.text, "plan-fleet")}
    assert fleet["L4"][2:5] == ["5", "1", "1 (bound)"]
    unknown = client.get("/planner?from_run=not-a-run", headers={"HX-Request": "true"})
    assert "from run: no run" in unknown.text


BIG = "9" * 400
HOSTILE = [
    ("rank=16", "rank=-1", "rank must be between 1 and 4096"),
    ("rank=16", "rank=nan", "rank: enter a whole number"),
    ("rank=16", "rank=" + "9" * 5000, "rank: enter a whole number"),
    ("link_gbps=1", "link_gbps=nan", "link gbps: enter a finite number"),
    ("link_gbps=1", "link_gbps=1e999", "link gbps: enter a finite number"),
    ("link_gbps=1", "link_gbps=0", "link speed must be greater than 0"),
    ("learner_gpus=4", "learner_gpus=0", "learner_gpus must be between 1 and 4,096"),
    ("learner_gpus=4", "learner_gpus=" + BIG, "learner_gpus must be between 1 and 4,096"),
    ("micro_batch_tokens=4096", "micro_batch_tokens=" + BIG, "micro_batch_tokens must be"),
    ("micro_batch_tokens=4096", "micro_batch_tokens=-5", "micro_batch_tokens must be"),
    ("learner_gpu=H100:2.5:4800", "learner_gpu=H100:1:1e308", "tokens/s must be between"),
    ("learner_gpu=H100:2.5:4800", "learner_gpu=H100:1e308:1", "price must be between"),
    ("worker_gpus=L4:0.35:1500", "worker_gpus=L4:1:1e-300", "tokens/s must be between"),
    ("worker_gpus=L4:0.35:1500", "worker_gpus=:::", "NAME:PRICE_PER_HOUR:TOKENS_PER_S"),
    ("completion_tokens=512", "completion_tokens=1e308", "completion_tokens must be between"),
    ("completion_tokens=512", "completion_tokens=" + BIG, "completion tokens: enter a finite"),
    ("group_size=8", "group_size=" + BIG, "group_size must be between 1 and 4,096"),
    ("bound_groups=16", "bound_groups=" + BIG, "bound_groups must be between"),
    ("worker_sequences=32", "worker_sequences=" + BIG, "worker_sequences must be between"),
    ("accept_fraction=0.8", "accept_fraction=1e-320", "accept_fraction must be between"),
    ("accept_fraction=0.8", "accept_fraction=nan", "accept fraction: enter a finite number"),
    ("model=qwen2.5-1.5b", "model=nosuch", "unknown model preset"),
    ("model=qwen2.5-1.5b", "model=/etc", "unknown model preset"),  # presets only, no paths
    ("targets=all-linear", "targets=x", "unknown target set"),
]


def test_hostile_fields_get_a_message_not_a_500(client: TestClient, admin_token: str) -> None:
    """Negative, zero, huge, NaN and unknown values, as a user (or a crafted URL) sends them:
    the fragment names the field and shows no tables; huge numbers used to answer 500
    (OverflowError)."""
    login(client, admin_token)
    for old, new, message in HOSTILE:
        query = QUERY.replace(old, new)
        assert query != QUERY, old
        r = client.get(query, headers={"HX-Request": "true"})
        assert r.status_code == 200, (new[:40], r.status_code)
        assert message in r.text, (new[:40], r.text[:300])
        assert 'id="plan-fleet"' not in r.text


def test_unknown_gpu_types_still_plan(client: TestClient, admin_token: str) -> None:
    login(client, admin_token)
    query = QUERY.replace("learner_gpu=H100:2.5:4800", "learner_gpu=TPU:2.5:4800")
    r = client.get(query.replace("L4:0.35:1500", "MI300X:2:3000"), headers={"HX-Request": "true"})
    assert r.status_code == 200 and "MI300X" in r.text and "fits" not in r.text
    lower = client.get(QUERY.replace("H100:2.5:4800", "h100:2.5:4800"), headers={"HX-Request": "1"})
    assert "fits 80 GB" in lower.text
