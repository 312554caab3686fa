"""Workload 9's raw-SQL arms: a hand-written relay that isolates failures the cheapest way.

What any relay must do when a message fails once and its transaction's order is kept: publish
the failed message and the rest of its claim, write the failure back (charge the row, give it a
retry backoff), hand back the rows of its transaction that came after it, and keep claiming past
them until the backoff ends, then claim the failed row and its followers again. This is that
relay in a psycopg loop, on the same table, and nothing more: no ordering keys, no dead letters,
no parking, no concurrent relays (a single relay can only be held back by a row in backoff, so
its claim ignores leases of others). Run with nothing failing and with workload 9's 2% failing,
its own ratio is what isolating failures costs a relay with none of the library's machinery:
the floor under :mod:`benchmarks.drain_failures`' target, measured in the same run.

* **The claim** (:data:`RAW_FAILING_CLAIM`, from :func:`probing_claim`): the raw claim
  (:data:`benchmarks.drain.RAW_CLAIM`) plus the two conditions order and backoff need: not in a
  retry backoff, and no earlier unpublished row of its transaction in one (a probe of the small
  ``ix_outbox_failing`` index per row it reads), rows handed back in claim order. It parks
  nothing, so it reads the rows it skips again on every claim: workload 8
  (:mod:`benchmarks.held_back`) prices that with 10,000 of them.
* **A pass with nothing failed**: :data:`benchmarks.drain.RAW_MARK`, as the raw drain.
* **A pass with a failure** (:data:`RAW_SETTLE`): mark, charge and hand back in one statement.
* **Nothing claimable but rows left**: wait for the earliest backoff to end
  (:data:`RAW_NEXT_RETRY`), as the library's relay does.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from typing import Any, Protocol

from benchmarks.drain import RAW_MARK
from benchmarks.harness import Context
from sqla_outbox import queries

__all__ = [
    "RAW_FAILING_CLAIM",
    "RAW_NEXT_RETRY",
    "RAW_SETTLE",
    "drain_raw_failing",
    "probing_claim",
]

_COLUMNS = ", ".join(queries.MESSAGE_FIELDS)
_ID = queries.MESSAGE_FIELDS.index("id")
_STAGED_AT = queries.MESSAGE_FIELDS.index("staged_at")

_STUCK = "e.published_at IS NULL AND e.attempts > 0 AND (e.retry_at > now(){dead})"
"""A failed row that holds back the rows after it: in a retry backoff (or, ``dead``, dead)."""


def probing_claim(*, keys: bool = False, dead: bool = False) -> str:
    """The hand-written claim that skips what a failed row holds back by probing for it.

    :data:`benchmarks.drain.RAW_CLAIM` plus: not in a retry backoff; no earlier row of its
    transaction stuck (:data:`_STUCK`: one probe of the small ``ix_outbox_failing`` index per
    row read); with ``keys``, none of its ordering key either (a probe of ``ix_outbox_key``);
    with ``dead``, dead letters are not taken and hold back like rows in backoff. Rows come
    back in claim order. Nothing is parked: every claim reads the held rows again and skips
    them, which is what makes it cheap while they are few.
    """
    stuck = _STUCK.format(dead=" OR e.dead_at IS NOT NULL" if dead else "")
    held = [
        f"NOT EXISTS (SELECT 1 FROM outbox e WHERE {stuck} "
        "AND e.staged_at = o.staged_at AND e.id < o.id)"
    ]
    if keys:
        held.append(
            f"NOT EXISTS (SELECT 1 FROM outbox e WHERE {stuck} "
            "AND e.ordering_key = o.ordering_key AND (e.staged_at, e.id) < (o.staged_at, o.id))"
        )
    if dead:
        held.append("o.dead_at IS NULL")
    return (
        "WITH claimed AS (UPDATE outbox SET claimed_by = %(token)s, claimed_at = now() "
        "WHERE id = ANY(ARRAY(SELECT o.id FROM outbox o WHERE o.published_at IS NULL "
        "AND o.run_at <= now() AND (o.retry_at IS NULL OR o.retry_at <= now()) "
        "AND (o.claimed_at IS NULL OR o.claimed_at < now() - interval '30 seconds') "
        f"AND {' AND '.join(held)} "
        "ORDER BY o.staged_at, o.id LIMIT %(batch)s FOR UPDATE SKIP LOCKED)) "
        f"RETURNING {_COLUMNS}) "
        "SELECT * FROM claimed ORDER BY staged_at, id"
    )


RAW_FAILING_CLAIM = probing_claim()
"""Workload 9's claim: the raw one, skipping rows in backoff and the later rows of their
transactions (the workload has no ordering keys and no dead letters)."""

RAW_SETTLE = (
    "WITH marked AS (UPDATE outbox SET published_at = now() WHERE id = ANY(%(published)s) "
    "AND claimed_by = %(token)s AND published_at IS NULL RETURNING 1), "
    "charged AS (UPDATE outbox SET attempts = attempts + 1, last_error = %(error)s, "
    "retry_at = now() + %(delay)s, claimed_by = NULL, claimed_at = NULL "
    "WHERE id = ANY(%(failed)s) AND claimed_by = %(token)s AND published_at IS NULL RETURNING 1), "
    "released AS (UPDATE outbox SET claimed_by = NULL, claimed_at = NULL "
    "WHERE id = ANY(%(held)s) AND claimed_by = %(token)s AND published_at IS NULL RETURNING 1) "
    "SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM charged), "
    "(SELECT count(*) FROM released)"
)
"""A pass with a failure, written back in one fenced statement: mark, charge, hand back."""

RAW_NEXT_RETRY = (
    "SELECT greatest(extract(epoch FROM min(retry_at) - now()), 0) FROM outbox "
    "WHERE published_at IS NULL AND attempts > 0"
)
"""Seconds until the earliest backoff ends (None when nothing is backing off)."""


class Publisher(Protocol):
    """What the loop publishes through: workload 9's publisher, by message id."""

    def publish_id(self, message_id: Any) -> None: ...

    def done(self) -> bool: ...


def drain_raw_failing(ctx: Context, publisher: Publisher, batch: int, retry: float) -> float:
    """Run the hand-written relay until ``publisher`` has everything; the seconds it took."""
    delay = dt.timedelta(seconds=retry)
    with ctx.raw() as conn:
        start = time.perf_counter()
        while not publisher.done():
            token = f"raw:{secrets.token_hex(8)}"
            rows = conn.execute(RAW_FAILING_CLAIM, {"token": token, "batch": batch}).fetchall()
            if not rows:
                row = conn.execute(RAW_NEXT_RETRY).fetchone()
                if row is None or row[0] is None:
                    break  # nothing left to wait for: the caller counts what is missing
                time.sleep(float(row[0]))
                continue
            published: list[Any] = []
            failed: list[Any] = []
            held: list[Any] = []
            waiting: set[Any] = set()  # transactions with a failed row in this pass
            error = ""
            for row in rows:
                if row[_STAGED_AT] in waiting:
                    held.append(row[_ID])
                    continue
                try:
                    publisher.publish_id(row[_ID])
                except Exception as failure:  # the publisher refused it: charge it
                    failed.append(row[_ID])
                    waiting.add(row[_STAGED_AT])
                    error = str(failure)
                    continue
                published.append(row[_ID])
            if failed:
                params: dict[str, Any] = {"published": published, "token": token}
                params.update(error=error, delay=delay, failed=failed, held=held)
                conn.execute(RAW_SETTLE, params)
            else:
                conn.execute(RAW_MARK, (published, token))
        return time.perf_counter() - start
