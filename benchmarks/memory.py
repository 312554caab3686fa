"""Workload 7: memory per staged message (informative, no target).

``tracemalloc`` peak above the starting point, divided by the number of messages:

* **staging**: ``memory_messages`` (10,000) ``outbox.enqueue`` calls in one session, before
  commit, against the baseline of building the same 10,000 row dicts a hand-written outbox
  would keep in a list (:func:`benchmarks.harness.outbox_row`: UUID, key string, input dict,
  timestamps). Both hold every message's data ready to insert; the difference is the library's
  bookkeeping (the frozen ``OutboxMessage``, its staging entry, per-message timestamps).
* **commit**: the peak through ``session.commit()`` of those 10,000 staged messages, against
  building the same list and ``session.execute(insert(OutboxRow.__table__), rows)`` + commit in
  a session: the transient cost of turning messages into parameters and the driver's buffers.

Arms are interleaved over a few rounds; each row reports the median.
"""

from __future__ import annotations

import datetime as dt
import gc
import tracemalloc
from collections.abc import Callable

import sqla_outbox as outbox
from benchmarks.harness import OUTBOX_INSERT, Context, Result, compare, interleave, outbox_row

__all__ = ["run"]

ROUNDS = 3


def _traced(body: Callable[[], Callable[[], None]], count: int) -> float:
    """Bytes per message of ``tracemalloc``'s peak while ``body`` runs (above where it began).

    ``body`` returns its clean-up, run once the peak has been read (outside the measurement).
    """
    gc.collect()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        cleanup = body()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    cleanup()
    return (peak - start) / count


def run(ctx: Context) -> list[Result]:
    count = ctx.scale.memory_messages
    ctx.clear_tables()

    def stage_ours(commit: bool) -> Callable[[], float]:
        def body() -> Callable[[], None]:
            session = ctx.sessions()
            for n in range(count):
                outbox.enqueue(session, "send_receipt", {"order_id": n})
            if commit:
                session.commit()
            return session.close

        return lambda: _traced(body, count)

    def build_raw(commit: bool) -> Callable[[], float]:
        def body() -> Callable[[], None]:
            now = dt.datetime.now(dt.timezone.utc)
            rows = [outbox_row("send_receipt", {"order_id": n}, now) for n in range(count)]
            if commit:
                with ctx.sessions() as session:
                    session.execute(OUTBOX_INSERT, rows)
                    session.commit()
            return rows.clear

        return lambda: _traced(body, count)

    ctx.log(f"tracemalloc: {count:,} messages per arm, {ROUNDS} rounds")
    samples = interleave(
        {
            "staging": stage_ours(commit=False),
            "row dicts": build_raw(commit=False),
            "commit": stage_ours(commit=True),
            "executemany": build_raw(commit=True),
        },
        ROUNDS,
    )
    return [
        compare(f"memory: staging {count:,} msgs", "B/msg", samples, "staging", "row dicts"),
        compare(f"memory: commit of {count:,} msgs", "B/msg", samples, "commit", "executemany"),
    ]
