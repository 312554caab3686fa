"""Workload 15: two relays against one on large transactions.

The backlog is :data:`TRANSACTIONS` transactions of :data:`PER_TRANSACTION` messages each
(committed through ``outbox.enqueue``; ``--quick``: a tenth of the transactions), snapshotted
once (``outbox_large_template``) and restored, vacuumed, analysed and checkpointed before every
run, untimed. A relay claims a batch of a transaction; a second relay must not wait for the rest
of it, but claim the next transaction: the claim passes a transaction held by another relay's
claim in one more read (:func:`sqla_outbox.plan.resume_after`). Arms, interleaved per round:

* **two relays**: two relays on ``start()`` until every message has been published once;
* **one relay** (the baseline): one relay the same way.

Rows/s from the first ``start()`` until the last message is published; ``stop()`` is untimed.
The publisher records each message (duplicates and missing ones are counted). Each relay's
batch is :data:`BATCH`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import sqla_outbox as outbox
from benchmarks.drain import RELAYS_TIMEOUT
from benchmarks.harness import (
    Context,
    Result,
    Target,
    compare,
    fill_backlog,
    fresh_pool,
    interleave,
)

__all__ = ["BATCH", "PER_TRANSACTION", "TRANSACTIONS", "run"]

TRANSACTIONS = 20
PER_TRANSACTION = 1_000
BATCH = 100
TARGET = 1.2

_SNAPSHOT = (
    "DROP TABLE IF EXISTS outbox_large_template",
    "CREATE TABLE outbox_large_template AS SELECT * FROM outbox",
)
_RESTORE = (
    "TRUNCATE outbox",
    "INSERT INTO outbox SELECT * FROM outbox_large_template",
    "VACUUM ANALYZE outbox",
    "CHECKPOINT",
)
TWO = "two relays, large transactions"
ONE = "one relay, large transactions"


def _drain(ctx: Context, relays: int, total: int, counts: list[tuple[int, int]]) -> float:
    """``relays`` relays on ``start()`` until every message is out; rows/s."""
    ctx.sql(*_RESTORE)
    seen: list[int] = []
    lock = threading.Lock()
    everything = threading.Event()

    def publish(message: outbox.OutboxMessage) -> None:
        with lock:
            seen.append(message.id.int)
            if len(seen) >= total:
                everything.set()

    fresh_pool(ctx.engine, connections=relays * 2)
    workers = [
        outbox.Relay(ctx.engine, publish, batch_size=BATCH, relay_id=f"large-{n}")
        for n in range(relays)
    ]
    start = time.perf_counter()
    for relay in workers:
        relay.start()
    everything.wait(RELAYS_TIMEOUT)
    elapsed = time.perf_counter() - start
    for relay in workers:
        relay.stop()
    counts.append((len(seen), len(set(seen))))
    return len(set(seen)) / elapsed


def run(ctx: Context) -> list[Result]:
    """Two relays against one on transactions of :data:`PER_TRANSACTION` messages."""
    transactions = TRANSACTIONS // 10 if ctx.quick else TRANSACTIONS
    total = transactions * PER_TRANSACTION
    ctx.clear_tables()
    ctx.log(f"filling {transactions} transactions of {PER_TRANSACTION:,} messages")
    fill_backlog(ctx, total, per_transaction=PER_TRANSACTION)
    ctx.sql(*_SNAPSHOT)
    counts: list[tuple[int, int]] = []

    def arm(relays: int) -> Callable[[], float]:
        return lambda: _drain(ctx, relays, total, counts)

    samples = interleave({TWO: arm(2), ONE: arm(1)}, ctx.scale.drain_rounds)
    duplicates = sum(published - distinct for published, distinct in counts)
    missing = sum(total - distinct for _published, distinct in counts)
    return [
        compare(
            f"two relays vs one, {PER_TRANSACTION:,}-message transactions (b={BATCH})",
            "rows/s",
            samples,
            TWO,
            ONE,
            Target("ratio", ">=", TARGET),
            duplicates=duplicates,
            missing=missing,
        )
    ]
