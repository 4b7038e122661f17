"""GET /api/v1/runs: an offset past what Postgres' BIGINT OFFSET holds is a 422 naming the
parameter, not a 500 (found by the API fuzzer)."""

from __future__ import annotations

from protocol.schemas import BIGINT_MAX


def test_offset_bounded_by_bigint(runs_client, admin) -> None:  # type: ignore[no-untyped-def]
    too_far = runs_client.get(f"/api/v1/runs?offset={BIGINT_MAX + 1}", headers=admin)
    assert too_far.status_code == 422, too_far.text
    assert [e["field"] for e in too_far.json()["errors"]] == ["query.offset"]
    last = runs_client.get(f"/api/v1/runs?offset={BIGINT_MAX}", headers=admin)
    assert last.status_code == 200, last.text
    assert last.json() == []
