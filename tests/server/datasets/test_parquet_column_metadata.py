"""A Parquet file whose column chunk metadata pyarrow's C++ refuses (size statistics whose
level histogram does not fit the column) ends a process that reads `row_group(g).column(c)`:
pyarrow's binding translates no C++ error there. The upload must be a 422 and the real
`asyncgrpo server` process must stay up (both databases)."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from protocol import parquet_pages
from tests.conftest import make_settings, mint_token
from tests.harness.serve import serve_in_process
from tests.server.datasets.files import required_in_schema

pytestmark = pytest.mark.timeout(120)


def _histogram_mismatch() -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["a", "b"], "n": [1, 2]}), buffer)
    return required_in_schema(buffer.getvalue(), "n")


def test_the_check_names_the_column_and_an_honest_file_passes(tmp_path: Path) -> None:
    bad, good = tmp_path / "bad.parquet", tmp_path / "good.parquet"
    bad.write_bytes(_histogram_mismatch())
    table = pa.table({"prompt": ["a"], "m": [[{"role": "user", "content": "hi"}]]})
    pq.write_table(table, good, row_group_size=1, write_page_index=True)
    with good.open("rb") as f:
        parquet_pages.check_column_chunks(f, pq.ParquetFile(good).metadata)
    with bad.open("rb") as f, pytest.raises(parquet_pages.PageError, match="'n'.*histogram"):
        parquet_pages.check_column_chunks(f, pq.ParquetFile(bad).metadata)


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def test_an_upload_whose_column_metadata_pyarrow_refuses_is_422_and_the_server_lives(
    app, settings, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {mint_token(app, 'admin', name='cm')}"}
    log = tmp_path / "server.log"
    with serve_in_process(settings.database_url, Path(settings.bucket_url), log) as (base, _pid):
        answer = httpx.post(
            f"{base}/api/v1/datasets",
            params={"name": "stats.parquet"},
            content=_histogram_mismatch(),
            headers=headers,
            timeout=60,
        )
        assert answer.status_code == 422, (answer.text, log.read_text()[-2000:])
        body = answer.json()
        assert (body["field"], body["code"]) == ("file", "page_unreadable"), body
        assert "'n'" in body["detail"] and "histogram" in body["detail"], body
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
