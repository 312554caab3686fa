"""Workload 16: a consumer's transaction with ``inbox.receive`` against the same transaction
recording the key by hand.

Each arm is one consumer transaction through an ORM ``Session``: record the message's key
(a new one every call, as a broker delivering a stream of distinct messages), write the
business effect (one ``bench_orders`` row), commit.

* **ours**: ``inbox.receive(session, key, consumer="bench")``;
* **hand-written** (the baseline): ``INSERT INTO outbox_inbox (consumer, key, received_at)
  VALUES (...) ON CONFLICT DO NOTHING RETURNING key`` through ``session.execute(text(...))``,
  what a careful application writes for itself: the same statement, the same table and index.

Interleaved call by call (:func:`benchmarks.harness.interleave_calls`); transactions/s. The
target is ours >= 0.95x the hand-written one: the key check and the dialect's statement cost a
few microseconds against a committed transaction's round trips and fsync.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from sqlalchemy import text

from benchmarks.harness import (
    BenchOrder,
    Context,
    Result,
    Target,
    compare,
    interleave_calls,
    run_for,
)
from sqla_outbox import inbox

__all__ = ["TARGET", "run"]

TARGET = 0.95

_HAND_WRITTEN = text(
    "INSERT INTO outbox_inbox (consumer, key, received_at) VALUES (:consumer, :key, now()) "
    "ON CONFLICT DO NOTHING RETURNING key"
)


def _arm(ctx: Context, name: str, ids: itertools.count[int]) -> Callable[[], None]:
    def transaction() -> None:
        n = next(ids)
        key = f"{name}:{n}"
        with ctx.sessions() as session:
            if name == "ours":
                first = inbox.receive(session, key, consumer="bench")
            else:
                found = session.execute(_HAND_WRITTEN, {"consumer": "bench", "key": key})
                first = found.first() is not None
            if first:
                session.add(BenchOrder(id=n, customer="c", total_cents=100))
            session.commit()

    return transaction


def run(ctx: Context) -> list[Result]:
    """Workload 16 (see the module docs)."""
    inbox.metadata.create_all(ctx.engine)
    ctx.clear_tables()
    ctx.sql("TRUNCATE outbox_inbox")
    ids = itertools.count(1)
    arms = {name: _arm(ctx, name, ids) for name in ("ours", "hand-written")}
    ctx.log("inbox: receive vs a hand-written INSERT ... ON CONFLICT DO NOTHING, interleaved")
    for operation in arms.values():  # warm the pool, statement caches and mapper configuration
        run_for(operation, min(0.3, ctx.scale.seconds))
    samples = interleave_calls(arms, ctx.scale.rounds, ctx.scale.seconds)
    ctx.sql("TRUNCATE outbox_inbox")
    return [
        compare(
            "consumer transaction: inbox.receive vs hand-written INSERT ON CONFLICT",
            "tx/s",
            samples,
            "ours",
            "hand-written",
            Target("ratio", ">=", TARGET),
        )
    ]
