"""SQLite's claim, read by SQLite's own planner: it takes the claimable rows through the partial
index that holds only them, so parked and dead rows ahead of them cost it nothing."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import Engine, event, insert

import sqla_outbox as outbox
from sqla_outbox.model import OutboxRow

PARKED = 2_000
DUE = 100


def test_the_sqlite_claim_reads_the_claimable_index_past_parked_rows(
    sqlite_engine: Engine,
) -> None:
    """With 2,000 parked rows ahead of 100 due ones and the table analysed, the claim a relay
    sends scans ``ix_outbox_claimable``, not ``ix_outbox_unpublished`` (which holds the parked
    rows too), and takes the due rows."""
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = [
        {
            "id": uuid.uuid4(),
            "job": "send_receipt",
            "queue": "default",
            "input": {"n": n},
            "idempotency_key": f"row-{n}",
            "max_attempts": 3,
            "run_at": start,
            "staged_at": start + dt.timedelta(seconds=n),
            "parked": n < PARKED,
        }
        for n in range(PARKED + DUE)
    ]
    with sqlite_engine.begin() as conn:
        conn.execute(insert(OutboxRow.__table__), rows)
        conn.exec_driver_sql("ANALYZE")

    claims: list[tuple[str, Any]] = []

    def keep_claims(*args: Any) -> None:
        statement, parameters = args[2], args[3]
        if "AS transaction_head" in statement:
            claims.append((statement, parameters))

    published: list[outbox.OutboxMessage] = []
    with outbox.Relay(sqlite_engine, published.append, batch_size=DUE) as relay:
        # A relay on an SQLite file runs on an engine of its own (stores.relay_engine).
        event.listen(relay.engine, "before_cursor_execute", keep_claims)
        relay.tick()
    assert len(published) == DUE

    statement, parameters = claims[-1]
    with sqlite_engine.connect() as conn:
        plan = [
            row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)
        ]
    reads = [step for step in plan if step.startswith(("SCAN outbox", "SEARCH outbox"))]
    assert reads, plan
    assert all("ix_outbox_claimable" in step for step in reads), plan
