"""Workloads 1 and 2: what ``outbox.enqueue`` costs a committing web request.

Every arm is one transaction in a new ``Session`` from one ``sessionmaker`` (the common
request-scoped shape), on the same engine, writing one ``bench_orders`` row:

* **ours**: the order + ``outbox.enqueue(session, "send_receipt", {"order_id": n})`` (x1 or x10).
  The library validates the call, mints a UUIDv7, stages the message, and inserts at commit.
* **hand-written**: the order + ``session.execute(insert(OutboxRow.__table__), rows)`` with the
  very same row dicts (same columns, same value kinds, a UUIDv7 id; one dict, or a list of ten,
  i.e. one ``executemany``). This is what a competent developer writes without the library: same
  table, same column types binding the values, same driver, same round trips. It skips only what
  the library adds: validation, the staging bookkeeping and its session event hooks.
* **business only** (workload 1): the order alone; the price of the outbox in any form.
* **DBAPI INSERT** (workload 1; ours must stay at 0.95 of it or better): the order + the
  library's own compiled INSERT of the same row, executed on the session's DBAPI connection
  (``driver_connection.execute``), so no SQLAlchemy statement execution at all. Against it,
  ours shows what going through SQLAlchemy's ``Connection`` costs: the price of the INSERT
  appearing in SQL logs, cursor events and tracing, and of errors arriving as SQLAlchemy
  exceptions.
* **raw SQL limit** (workload 1, informative): the same two transactions, order alone and order
  plus the same outbox row, from a bare psycopg connection with no SQLAlchemy on either side.
  Their ratio is what one more row in the transaction costs the database itself (a round trip,
  a heap insert, two index insertions), which bounds the "vs business row only" ratio: the ORM's
  own per-transaction cost only dilutes it.

Rates are committed transactions per second. The arms take turns of ten transactions each
within a round (:func:`benchmarks.harness.interleave_calls`), so every arm of a round runs
across the same seconds: these transactions wait on the commit's fsync, whose time can swing by
2x from one second to the next, far more than the differences measured.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable

from psycopg.types.json import Jsonb
from sqlalchemy.orm import Session

import sqla_outbox as outbox
from benchmarks.harness import (
    OUTBOX_INSERT,
    BenchOrder,
    Context,
    Result,
    Target,
    compare,
    interleave_calls,
    outbox_row,
    run_for,
)

__all__ = ["run_batch", "run_single"]

JOB = "send_receipt"
_ORDER_IDS = itertools.count(1)
"""Order keys, unique across every arm and workload of a run."""


_COLUMNS = list(outbox.OutboxMessage._fields)
_RAW_ORDER = "INSERT INTO bench_orders (id, customer, total_cents) VALUES (%s, %s, %s)"

OutboxWrite = Callable[[Session, int], None]
"""What an arm adds to the order's transaction: the outbox write for order ``n``, or nothing."""


def _order_transaction(ctx: Context, write: OutboxWrite | None) -> Callable[[], None]:
    """One arm: a new session, one order row, ``write``, commit. Every arm shares this shape."""
    sessions = ctx.sessions
    counter = _ORDER_IDS

    def transaction() -> None:
        n = next(counter)
        with sessions() as session:
            session.add(BenchOrder(id=n, customer="customer", total_cents=n))
            if write is not None:
                write(session, n)
            session.commit()

    return transaction


def _arms(ctx: Context, messages: int) -> dict[str, Callable[[], None]]:
    """One-transaction operations: ours, hand-written, business only. Keys are display names."""

    def ours(session: Session, n: int) -> None:
        for _ in range(messages):
            outbox.enqueue(session, JOB, {"order_id": n})

    def hand_written(session: Session, n: int) -> None:
        now = dt.datetime.now(dt.timezone.utc)
        rows = [outbox_row(JOB, {"order_id": n}, now) for _ in range(messages)]
        session.execute(OUTBOX_INSERT, rows[0] if messages == 1 else rows)

    return {
        "ours": _order_transaction(ctx, ours),
        "hand-written": _order_transaction(ctx, hand_written),
        "business only": _order_transaction(ctx, None),
    }


def _dbapi_arm(ctx: Context) -> Callable[[], None]:
    """The order + the library's INSERT on the session's DBAPI connection, bypassing SQLAlchemy."""
    outbox_sql = _compiled_insert(ctx)

    def dbapi_insert(session: Session, n: int) -> None:
        row = outbox_row(JOB, Jsonb({"order_id": n}), dt.datetime.now(dt.timezone.utc))
        driver = session.connection().connection.driver_connection
        assert driver is not None  # a checked-out connection always has one
        driver.execute(outbox_sql, row)

    return _order_transaction(ctx, dbapi_insert)


def _compiled_insert(ctx: Context) -> bytes:
    """The INSERT the library itself compiles: the row's keys are the message's fields."""
    compiled = OUTBOX_INSERT.compile(dialect=ctx.engine.dialect, column_keys=_COLUMNS)
    return str(compiled).encode()


def _raw_arms(ctx: Context) -> tuple[dict[str, Callable[[], None]], Callable[[], None]]:
    """Business only / business + outbox row, on one bare psycopg connection; and its close."""
    conn = ctx.raw(autocommit=False)
    outbox_sql = _compiled_insert(ctx)
    order_sql = _RAW_ORDER.encode()
    counter = _ORDER_IDS

    def raw_business() -> None:
        n = next(counter)
        conn.execute(order_sql, (n, "customer", n))
        conn.commit()

    def raw_with_outbox() -> None:
        n = next(counter)
        conn.execute(order_sql, (n, "customer", n))
        row = outbox_row(JOB, Jsonb({"order_id": n}), dt.datetime.now(dt.timezone.utc))
        conn.execute(outbox_sql, row)
        conn.commit()

    arms = {"raw: business + outbox row": raw_with_outbox, "raw: business only": raw_business}
    return arms, conn.close


def _measure(ctx: Context, arms: dict[str, Callable[[], None]]) -> dict[str, list[float]]:
    ctx.clear_tables()
    seconds = ctx.scale.seconds
    for operation in arms.values():  # warm the pool, statement caches and mapper configuration
        run_for(operation, min(0.3, seconds))
    return interleave_calls(arms, ctx.scale.rounds, seconds)


def run_single(ctx: Context) -> list[Result]:
    """Workload 1: one message per transaction, against hand-written and business-only."""
    raw_arms, close_raw = _raw_arms(ctx)
    arms = {**_arms(ctx, messages=1), "DBAPI INSERT": _dbapi_arm(ctx), **raw_arms}
    ctx.log("enqueue x1: ours / hand-written / business only / DBAPI / raw-SQL pair, interleaved")
    try:
        samples = _measure(ctx, arms)
    finally:
        close_raw()
    return [
        compare(
            "enqueue 1 msg vs hand-written INSERT",
            "tx/s",
            samples,
            "ours",
            "hand-written",
            Target("ratio", ">=", 0.9),
        ),
        compare(
            "enqueue 1 msg vs business row only",
            "tx/s",
            samples,
            "ours",
            "business only",
            Target("ratio", ">=", 0.75),
        ),
        compare(
            "enqueue 1 msg vs the same INSERT on the DBAPI connection",
            "tx/s",
            samples,
            "ours",
            "DBAPI INSERT",
            Target("ratio", ">=", 0.95),
        ),
        compare(
            "enqueue 1 msg, DBAPI INSERT in the ORM transaction vs business only",
            "tx/s",
            samples,
            "DBAPI INSERT",
            "business only",
        ),
        compare(
            "enqueue 1 msg, raw SQL limit: +outbox row vs business only",
            "tx/s",
            samples,
            "raw: business + outbox row",
            "raw: business only",
        ),
    ]


def run_batch(ctx: Context) -> list[Result]:
    """Workload 2: ten messages per transaction, against one hand-written executemany of ten."""
    arms = _arms(ctx, messages=10)
    del arms["business only"]
    ctx.log("enqueue x10: ours / hand-written executemany, interleaved")
    samples = _measure(ctx, arms)
    return [
        compare(
            "enqueue 10 msgs vs hand-written executemany",
            "tx/s",
            samples,
            "ours",
            "hand-written",
            Target("ratio", ">=", 0.85),
        )
    ]
