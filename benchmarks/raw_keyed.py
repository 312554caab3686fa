"""Workload 14's raw-SQL arms: a hand-written relay that keeps transaction and key order.

The floor under :mod:`benchmarks.hot_keys`' target: the cheapest relay, written by hand in a
psycopg loop on the same table, that gives what the library promises a drain over hot keys,
and nothing more. A message is published only after every earlier unpublished message of its
transaction and of its ordering key; a failed one is charged a backoff and holds back, in the
pass and in later claims, its transaction and key and (through them) what waits for those; rows
of other keys go on; a claim reads a bounded number of rows however many are held. It needs no
leases of other relays (it is the only relay), no dead letters, no parking.

* **The claim** (:func:`claim`), one transaction: read the unpublished rows in claim order, a
  window of ``batch`` at a time, locked (``FOR UPDATE``, as a claim that other relays could
  meet must lock what it plans on), each with whether it waits (not due, in a backoff, or
  claimed); walk them in Python, holding back a row whose transaction or key is held and
  holding its transaction and key in turn; stop at ``batch`` rows taken or after
  :data:`WINDOWS` windows (the same bound as the library's planned claim); stamp what it took
  by id.
* **The pass**: publish in order, holding back what a failure in the pass holds (transaction
  and key), then one fenced statement: :data:`benchmarks.drain.RAW_MARK`, or
  :data:`benchmarks.raw_failures.RAW_SETTLE` (mark, charge, hand back) after a failure.
* **Nothing taken**: wait for the earliest backoff to end
  (:data:`benchmarks.raw_failures.RAW_NEXT_RETRY`), as the library's relay does.

What it leaves out makes it faster than any relay with the library's promises could be: it
does not park what a failure holds back (so its claims read those rows again while the
failure's backoff lasts, which a 1 ms backoff makes cheap), and it meets no other relay's rows.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
import uuid
from typing import Any

from benchmarks.drain import RAW_MARK
from benchmarks.harness import Context
from benchmarks.raw_failures import (
    RAW_SETTLE,
    Publisher,
    RawPass,
    publish_rows,
    wait_for_next_retry,
)
from sqla_outbox import queries

__all__ = ["RAW_KEYED_STAMP", "RAW_KEYED_WINDOW", "WINDOWS", "claim", "drain_raw_keyed"]

WINDOWS = 16
"""Windows one claim reads at most: the library's planned claim reads as many."""

_COLUMNS = ", ".join(f"o.{name}" for name in queries.MESSAGE_FIELDS)
_ID = queries.MESSAGE_FIELDS.index("id")
_STAGED_AT = queries.MESSAGE_FIELDS.index("staged_at")
_KEY = queries.MESSAGE_FIELDS.index("ordering_key")
_FRONT = (dt.datetime.min.replace(tzinfo=dt.timezone.utc), uuid.UUID(int=0))

RAW_KEYED_WINDOW = (
    f"SELECT {_COLUMNS}, (o.run_at > now() OR coalesce(o.retry_at > now(), false) "
    "OR coalesce(o.claimed_at >= now() - interval '30 seconds', false)) AS waits "
    "FROM outbox o WHERE o.published_at IS NULL AND o.dead_at IS NULL AND NOT o.parked "
    "AND (o.staged_at, o.id) > (%(staged_at)s, %(id)s) "
    "ORDER BY o.staged_at, o.id LIMIT %(batch)s FOR UPDATE"
)
"""One window of the claim: the next ``batch`` unpublished rows after a position, locked, each
with whether it waits (the partial index ``ix_outbox_claimable`` serves it)."""

RAW_KEYED_STAMP = (
    "UPDATE outbox SET claimed_by = %(token)s, claimed_at = now() WHERE id = ANY(%(ids)s)"
)
"""The claim's stamp of the rows it took, by primary key."""


class _Holds:
    """Transactions and keys held back, by a row that waits or by a failure."""

    def __init__(self) -> None:
        self.groups: set[Any] = set()
        self.keys: set[str] = set()

    def hold(self, row: Any) -> None:
        self.groups.add(row[_STAGED_AT])
        if row[_KEY] is not None:
            self.keys.add(row[_KEY])

    def holds(self, row: Any) -> bool:
        """Whether ``row`` waits for a held transaction or key (and then holds its own)."""
        held = row[_STAGED_AT] in self.groups or (row[_KEY] is not None and row[_KEY] in self.keys)
        if held:
            self.hold(row)
        return held


def claim(conn: Any, token: str, batch: int) -> list[Any]:
    """Take up to ``batch`` rows in order, none ahead of an earlier unpublished row of its
    transaction or key; see the module documentation."""
    taken: list[Any] = []
    holds = _Holds()
    staged_at, after = _FRONT
    with conn.transaction():
        for _window in range(WINDOWS):
            rows = conn.execute(
                RAW_KEYED_WINDOW, {"staged_at": staged_at, "id": after, "batch": batch}
            ).fetchall()
            for row in rows:
                if holds.holds(row):
                    continue
                if row[-1]:
                    holds.hold(row)
                    continue
                taken.append(row)
                if len(taken) == batch:
                    break
            if len(taken) == batch or len(rows) < batch:
                break
            staged_at, after = rows[-1][_STAGED_AT], rows[-1][_ID]
        if taken:
            conn.execute(RAW_KEYED_STAMP, {"token": token, "ids": [row[_ID] for row in taken]})
    return taken


RAW_RETRIED_MARK = (
    "UPDATE outbox SET published_at = now(), "
    "attempts = attempts + cardinality(array_positions(%(failed)s::uuid[], id)), "
    "last_error = CASE WHEN id = ANY(%(failed)s::uuid[]) THEN %(error)s ELSE last_error END "
    "WHERE id = ANY(%(published)s::uuid[]) AND claimed_by = %(token)s AND published_at IS NULL"
)
"""The retrying loop's mark of a pass whose failures were all retried and published in it:
each row charged once per failure it had, in the same fenced statement."""


def _publish_retrying(rows: list[Any], token: str, publisher: Publisher, retry: float) -> RawPass:
    """Publish a claim's rows as :func:`~benchmarks.raw_failures.publish_rows` does, then wait
    out the failures' backoff and publish what they held back (the failed rows first), in
    order, until nothing fails."""
    done = RawPass(token)
    while rows:
        part = publish_rows(rows, token, publisher, _Holds())
        done.published += part.published
        if not part.failed:
            break
        done.failed += part.failed
        done.error = part.error
        waiting = {*part.failed, *part.held}
        rows = [row for row in rows if row[_ID] in waiting]
        time.sleep(retry)
    return done


def drain_raw_keyed(
    ctx: Context,
    publisher: Publisher,
    batch: int,
    retry: float,
    timeout: float,
    *,
    retrying: bool = False,
) -> float:
    """Run the hand-written keyed relay until ``publisher`` has everything (or ``timeout``
    seconds have passed); the seconds it took.

    With ``retrying``, a pass does not hand a failure back: it keeps the claim through the
    failed rows' backoff and retries them, then publishes what they held back, in order, and
    marks everything in one statement (:data:`RAW_RETRIED_MARK`). A design the library does
    not have: its relay would have to renew the claim meanwhile, bound how long a backoff it
    waits out in a pass, and dead-letter in the pass; one relay with a 30-second lease and a
    1 ms backoff needs none of that.
    """
    delay = dt.timedelta(seconds=retry)
    with ctx.raw() as conn:
        start = time.perf_counter()
        while not publisher.done() and time.perf_counter() - start < timeout:
            token = f"raw:{secrets.token_hex(8)}"
            rows = claim(conn, token, batch)
            if not rows:
                if not wait_for_next_retry(conn):
                    break  # nothing left to wait for: the caller counts what is missing
                continue
            if retrying:
                done = _publish_retrying(rows, token, publisher, retry)
                params = {"token": token, "published": done.published, "failed": done.failed}
                conn.execute(RAW_RETRIED_MARK, {**params, "error": done.error})
                continue
            done = publish_rows(rows, token, publisher, _Holds())
            if done.failed:
                conn.execute(RAW_SETTLE, done.params("token", delay))
            else:
                conn.execute(RAW_MARK, (done.published, token))
        return time.perf_counter() - start
