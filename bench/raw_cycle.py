"""The lease engine's own Postgres statements for one lease cycle (acquire → heartbeat → upload
→ complete), run straight through psycopg's async driver, autocommitted: no HTTP, no FastAPI,
no thread hop, no SQLAlchemy at run time. The floor bench/leases.py and bench/fleet.py compare
the API with: the same `units.Statement`s the engine runs."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

Conn = AsyncConnection[Any]


def _statement(name: str) -> Any:
    from server.leases import fenced, statements
    from server.wiring import wire

    wire()  # every work kind registered, as the server does

    return {
        "grant": statements._GRANT,  # noqa: SLF001 - the engine's own units
        "beat": fenced._beat(),  # noqa: SLF001
        "upload": fenced._UPLOADING,  # noqa: SLF001
        "accept": statements._ACCEPT,  # noqa: SLF001
    }[name]


async def _fetch(conn: Conn, name: str, params: dict[str, Any]) -> list[Any]:
    statement = _statement(name)
    cursor = await conn.execute(statement.postgres, {**statement.constants, **params})
    return await cursor.fetchall()


async def grant(conn: Conn, params: dict[str, Any]) -> int | None:
    """The one-statement grant (server/leases/queue.py); the lease's fencing token, or None."""
    rows = await _fetch(conn, "grant", params)
    return int(rows[0][4]) if rows else None  # the `fencing` column


async def extend(conn: Conn, digest: str, lease_id: uuid.UUID, fencing: int) -> bool:
    """The heartbeat's one statement (server/leases/statements.py), admission control off."""
    params = {"digest": digest, "lease_id": lease_id, "held_fencing": fencing, "ttl_s": 60.0,
              "admission": False, "max_staleness": 0}  # fmt: skip
    rows = await _fetch(conn, "beat", params)
    return bool(rows and rows[0][-1])


async def mark_uploading(conn: Conn, digest: str, lease_id: uuid.UUID, fencing: int) -> bool:
    params = {"digest": digest, "lease_id": lease_id, "held_fencing": fencing}
    return bool(await _fetch(conn, "upload", params))


async def accept(
    conn: Conn, digest: str, lease_id: uuid.UUID, fencing: int, batch: dict[str, Any]
) -> bool:
    """complete's accept in one statement (server/leases/statements.py)."""
    params = {
        **batch,
        "manifest": Jsonb(batch["manifest"]),
        "batch_id": uuid.uuid4(),
        "lease_id": lease_id,
        "digest": digest,
        "fencing": fencing,
    }
    return bool(await _fetch(conn, "accept", params))
