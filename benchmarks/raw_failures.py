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

The same loop **with parking** (``loop="parking"``): the cheapest hand-written relay whose
claim stays bounded however many rows a failure holds back, the promise the library's parking
keeps (workload 8). It adds to the loop above exactly what that promise needs, and nothing else:

* **The claim** (:data:`RAW_PARKING_CLAIM`) reads only rows that are not parked; a row it finds
  behind a row in backoff (the same probe) is parked in the same statement instead of skipped,
  so no later claim reads it again.
* **A pass with a failure** (:data:`RAW_PARKING_SETTLE`) parks what it hands back, and the
  unclaimed later rows of the failed rows' transactions.
* **Every mark** (:data:`RAW_PARKING_MARK`, and the settle's) unparks the parked rows of the
  marked rows' transactions in the same statement: their holder is out.

And **riding** (``loop="riding"``, the bounded floor): the parking loop with each pass's
write-back sent inside the next claim (:data:`RAW_RIDING_CLAIMS`), one statement a pass, as the
library's relay sends it; the claim then leaves the previous claim's rows and, after a failure,
the failed rows' transactions, which its own write-back parks.

And **keeping** (``loop="keeping"``), a floor for a design the library does not have: the riding
loop, except that a failed row and the rows of its transaction after it in its claim stay
claimed by the relay through the backoff. The write-back charges the failed row (same backoff)
and parks only the unclaimed later rows of its transaction; nothing is handed back, parked and
unparked, or claimed again. Once the backoff has passed, a later pass publishes the kept rows in
order (their marks fenced on the claims that took them), together with that pass's own claim.
Its claims (:data:`RAW_KEEPING_CLAIMS`) step over the kept rows (their lease is live), and hold
a transaction back behind any failed, unpublished row of it, whether its backoff is over or not.
A single relay with a 30-second lease needs no renewal for a 50 ms backoff; a library relay
would have to renew kept claims, hand them back on stop, and fence them against other relays.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from benchmarks.drain import RAW_MARK
from benchmarks.harness import Context
from sqla_outbox import queries

__all__ = [
    "RAW_FAILING_CLAIM",
    "RAW_KEEPING_CLAIMS",
    "RAW_NEXT_RETRY",
    "RAW_PARKING_CLAIM",
    "RAW_PARKING_MARK",
    "RAW_PARKING_SETTLE",
    "RAW_RIDING_CLAIMS",
    "RAW_SETTLE",
    "Holds",
    "RawPass",
    "drain_raw_failing",
    "probing_claim",
    "publish_rows",
    "wait_for_next_retry",
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


def _write_back(
    token: str, *, failed: bool, parks: bool = True, keeps: bool = False, claims: str = ""
) -> list[str]:
    """The CTEs that write a pass back, fenced on ``%(token)s`` (or on ``claims``, SQL naming
    several claims' tokens).

    Mark what was published; with ``failed`` also charge the failed rows and hand back the rows
    they held back in the claim. With ``parks`` (the parking loops) the mark also unparks the
    parked rows of its transactions (their holder is out; ``= ANY(ARRAY(...))`` probes the small
    ``ix_outbox_parked_group`` once per marked row, where ``IN (SELECT ...)`` may compare every
    parked row with every marked one), what is handed back is parked, and so are the unclaimed
    later rows of the failed rows' transactions. With ``keeps`` (the keeping loop) the failed
    rows and what they held back stay claimed: charged, nothing handed back.
    """
    fence = f"claimed_by = {claims or f'%({token})s'} AND published_at IS NULL"
    ctes = [
        "marked AS (UPDATE outbox SET published_at = now() "
        f"WHERE id = ANY(%(published)s::uuid[]) AND {fence} RETURNING staged_at)"
    ]
    if parks:
        ctes.append(
            "unparked AS (UPDATE outbox SET parked = false WHERE parked "
            "AND staged_at = ANY(ARRAY(SELECT staged_at FROM marked)) RETURNING 1)"
        )
    if failed:
        release = "" if keeps else ", claimed_by = NULL, claimed_at = NULL"
        ctes.append(
            "charged AS (UPDATE outbox SET attempts = attempts + 1, last_error = %(error)s, "
            f"retry_at = now() + %(delay)s{release} "
            f"WHERE id = ANY(%(failed)s::uuid[]) AND {fence} RETURNING 1)"
        )
    if failed and not keeps:
        ctes.append(
            "released AS (UPDATE outbox SET claimed_by = NULL, claimed_at = NULL"
            f"{', parked = true' if parks else ''} "
            f"WHERE id = ANY(%(held)s::uuid[]) AND {fence} RETURNING 1)"
        )
    if failed and parks:
        ctes.append(
            "behind AS (UPDATE outbox o SET parked = true "
            "FROM unnest(%(failed)s::uuid[], %(failed_at)s::timestamptz[]) AS f(id, staged_at) "
            "WHERE o.staged_at = f.staged_at AND o.id > f.id AND o.published_at IS NULL "
            "AND o.claimed_by IS NULL AND NOT o.parked RETURNING 1)"
        )
    return ctes


def _written(*, failed: bool, parks: bool = True) -> str:
    """A write-back on its own: its CTEs, and the rows each touched."""
    ctes = _write_back("token", failed=failed, parks=parks)
    counts = ", ".join(f"(SELECT count(*) FROM {cte.split(' AS ', 1)[0]})" for cte in ctes)
    return f"WITH {', '.join(ctes)} SELECT {counts}"


RAW_SETTLE = _written(failed=True, parks=False)
"""A pass with a failure, written back in one fenced statement: mark, charge, hand back."""


def _parking_claim(
    carries: str | None = None,
    *,
    write_back: list[str] | None = None,
    holder: str = _STUCK.format(dead=""),
) -> str:
    """The parking loop's claim: only rows not parked; a row found behind a row in backoff is
    parked, not skipped, so no later claim reads it again. Each row ends with the count of rows
    the claim parked; with none claimed, one row of NULLs and that count (a claim that only
    parked goes again at once: it made room).

    ``carries`` (``"mark"`` or ``"settle"``): the previous pass's write-back rides on the claim,
    fenced on ``%(previous)s``, as the library's relay does it. Every part sees one snapshot, in
    which the previous claim's rows are still claimed and unpublished: the claim leaves them,
    and, after a failure, the failed rows' transactions, which the write-back parks.

    ``write_back``: other CTEs to carry than the parking loops' (the keeping loop's);
    ``holder``: what an earlier row of a candidate's transaction must be to hold it back (``e``
    is that row).
    """
    if write_back is None:
        write_back = [] if carries is None else _write_back("previous", failed=carries == "settle")
    ctes = list(write_back)
    leave = ""
    if carries is not None:
        leave = "AND o.claimed_by IS DISTINCT FROM %(previous)s "
    if carries == "settle":
        leave += "AND o.staged_at <> ALL(%(failed_at)s::timestamptz[]) "
    ctes += [
        "candidates AS (SELECT o.id, o.staged_at FROM outbox o WHERE o.published_at IS NULL "
        "AND o.dead_at IS NULL AND NOT o.parked AND o.run_at <= now() "
        "AND (o.retry_at IS NULL OR o.retry_at <= now()) "
        "AND (o.claimed_at IS NULL OR o.claimed_at < now() - interval '30 seconds') "
        f"{leave}ORDER BY o.staged_at, o.id LIMIT %(batch)s FOR UPDATE SKIP LOCKED)",
        "held AS (SELECT c.id FROM candidates c WHERE EXISTS (SELECT 1 FROM outbox e "
        f"WHERE {holder} AND e.staged_at = c.staged_at AND e.id < c.id))",
        "parked AS (UPDATE outbox SET parked = true WHERE id IN (SELECT id FROM held) RETURNING 1)",
        "claimed AS (UPDATE outbox SET claimed_by = %(token)s, claimed_at = now() "
        "WHERE id = ANY(ARRAY(SELECT id FROM candidates WHERE id NOT IN (SELECT id FROM held))) "
        f"RETURNING {_COLUMNS})",
    ]
    return (
        f"WITH {', '.join(ctes)} "
        "SELECT claimed.*, (SELECT count(*) FROM parked) FROM (SELECT 1) AS one "
        "LEFT JOIN claimed ON true ORDER BY staged_at, id"
    )


RAW_PARKING_CLAIM = _parking_claim()
"""The parking loop's claim (:func:`_parking_claim`), on its own."""
RAW_PARKING_MARK = _written(failed=False)
"""The parking loop's mark: :data:`benchmarks.drain.RAW_MARK`, unparking behind what it marks."""
RAW_PARKING_SETTLE = _written(failed=True)
"""A pass with a failure in the parking loop: :data:`RAW_SETTLE`, parking what it hands back
and the unclaimed later rows of the failed rows' transactions, and unparking behind its mark."""
RAW_RIDING_CLAIMS = {carries: _parking_claim(carries) for carries in ("mark", "settle")}
"""The riding loop's claims, by what they carry: a mark, or a pass with a failure."""

_FAILED = "e.published_at IS NULL AND e.attempts > 0"
"""A failed row the keeping loop holds back behind: unpublished, whether its backoff is over
or not (it is kept in the relay until its retry publishes it, never claimed again)."""


def _keeping_claim(carries: str | None, *, kept: bool = False) -> str:
    """The keeping loop's claim: the bounded floor's (:func:`_parking_claim`), carrying the
    keeping write-back (:func:`_write_back` with ``keeps``: a failed row is charged and stays
    claimed, and so do the rows of its transaction after it in the claim; the unclaimed later
    rows of its transaction are parked), fenced on the pass's claim or, with ``kept`` (the pass
    published kept rows too), on the claims in ``%(tokens)s``. A failed, unpublished row holds
    back its transaction whether its backoff is over or not (:data:`_FAILED`). Kept rows are
    claimed (their lease is live), so the claim steps over them."""
    claims = "ANY(%(tokens)s::text[])" if kept else ""
    write_back = None
    if carries is not None:
        failed = carries == "settle"
        write_back = _write_back("previous", failed=failed, keeps=True, claims=claims)
    return _parking_claim(carries, write_back=write_back, holder=_FAILED)


RAW_KEEPING_CLAIMS = {
    (carries, kept): _keeping_claim(carries, kept=kept)
    for carries in (None, "mark", "settle")
    for kept in (False, True)
}
"""The keeping loop's claims, by what they carry (nothing, a mark, or a pass with a failure) and
whether that pass published kept rows (its write-back is then fenced on several claims)."""

RAW_NEXT_RETRY = (
    "SELECT greatest(extract(epoch FROM min(retry_at) - now()), 0) FROM outbox "
    "WHERE published_at IS NULL AND attempts > 0"
)
"""Seconds until the earliest backoff ends (None when nothing is backing off)."""


def wait_for_next_retry(conn: Any) -> bool:
    """Sleep until the earliest backoff ends; ``False`` (at once) when nothing is backing off."""
    row = conn.execute(RAW_NEXT_RETRY).fetchone()
    if row is None or row[0] is None:
        return False
    time.sleep(float(row[0]))
    return True


class Publisher(Protocol):
    """What the loop publishes through: workload 9's publisher, by message id."""

    def publish_id(self, message_id: Any) -> None: ...

    def done(self) -> bool: ...


@dataclass
class RawPass:
    """What one pass of a hand-written loop did with its claim."""

    token: str
    published: list[Any] = field(default_factory=list)
    failed: list[Any] = field(default_factory=list)
    failed_at: list[Any] = field(default_factory=list)
    held: list[Any] = field(default_factory=list)
    error: str = ""

    def params(self, token: str, delay: dt.timedelta) -> dict[str, Any]:
        """Its write-back's parameters, fenced on ``token``."""
        params: dict[str, Any] = {token: self.token, "published": self.published}
        if self.failed:
            params.update(
                error=self.error,
                delay=delay,
                failed=self.failed,
                failed_at=self.failed_at,
                held=self.held,
            )
        return params


class Holds(Protocol):
    """What a failure in a pass holds back: ``hold(row)`` after it failed, ``holds(row)`` for
    each later row (which then holds what waits for it in turn)."""

    def hold(self, row: Any) -> None: ...

    def holds(self, row: Any) -> bool: ...


class _TransactionHolds:
    """Workload 9's holds: a failed row's transaction (the workload has no ordering keys)."""

    def __init__(self) -> None:
        self.groups: set[Any] = set()

    def hold(self, row: Any) -> None:
        self.groups.add(row[_STAGED_AT])

    def holds(self, row: Any) -> bool:
        return row[_STAGED_AT] in self.groups


def publish_rows(
    rows: list[Any], token: str, publisher: Publisher, holds: Holds | None = None
) -> RawPass:
    """Publish a claim's rows in order; a failed row holds back what ``holds`` says (by default
    its transaction's later rows)."""
    done = RawPass(token)
    held = _TransactionHolds() if holds is None else holds
    for row in rows:
        if held.holds(row):
            done.held.append(row[_ID])
            continue
        try:
            publisher.publish_id(row[_ID])
        except Exception as failure:  # the publisher refused it: charge it
            done.failed.append(row[_ID])
            done.failed_at.append(row[_STAGED_AT])
            held.hold(row)
            done.error = str(failure)
            continue
        done.published.append(row[_ID])
    return done


@dataclass
class _Kept:
    """Rows a failure holds in the keeping loop: the failed row first, then the rows of its
    transaction after it that its claim took; all still claimed by ``token``."""

    token: str
    rows: list[Any]
    due: float
    """``time.monotonic()`` when the failed row's backoff ends."""


@dataclass
class _KeepingPass(RawPass):
    """What one pass of the keeping loop did: its write-back, fenced on its claim (``token``)
    and on those of the kept rows it retried (``tokens``), and what it keeps."""

    tokens: list[str] = field(default_factory=list)
    kept: list[_Kept] = field(default_factory=list)

    def params(self, token: str, delay: dt.timedelta) -> dict[str, Any]:
        """Its write-back's parameters (the rows it held back are not written: they are kept)."""
        return {**super().params(token, delay), "tokens": self.tokens}


def _publish_keeping(
    groups: list[tuple[str, list[Any]]], publisher: Publisher, retry: float
) -> _KeepingPass:
    """Publish ``(token, rows)`` groups as :func:`publish_rows` does (the claim, then the due kept
    groups); a failed row and the rows its failure held back in the same group are kept,
    claimed, for its retry, one group per transaction."""
    done = _KeepingPass(groups[0][0], tokens=[token for token, _rows in groups])
    for token, rows in groups:
        part = publish_rows(rows, token, publisher)
        done.published += part.published
        if not part.failed:
            continue
        done.failed += part.failed
        done.failed_at += part.failed_at
        done.error = part.error
        waiting = {*part.failed, *part.held}
        due = time.monotonic() + retry
        kept: dict[Any, _Kept] = {}  # by transaction
        for row in rows:
            if row[_ID] in waiting:
                kept.setdefault(row[_STAGED_AT], _Kept(token, [], due)).rows.append(row)
        done.kept += kept.values()
    return done


def _new_pass(batch: int) -> tuple[str, dict[str, Any]]:
    """A pass's fence token, and its claim's parameters so far."""
    token = f"raw:{secrets.token_hex(8)}"
    return token, {"token": token, "batch": batch}


def _drain_keeping(ctx: Context, publisher: Publisher, batch: int, retry: float) -> float:
    """The keeping loop (see :func:`drain_raw_failing`); the seconds it took."""
    delay = dt.timedelta(seconds=retry)
    carried: _KeepingPass | None = None
    kept: list[_Kept] = []
    with ctx.raw() as conn:
        start = time.perf_counter()
        while not publisher.done():
            token, params = _new_pass(batch)
            wrote = carried is not None
            if carried is None:
                claim = RAW_KEEPING_CLAIMS[None, False]
            else:
                carries = "settle" if carried.failed else "mark"
                claim = RAW_KEEPING_CLAIMS[carries, len(carried.tokens) > 1]
                params.update(carried.params("previous", delay))
                carried = None
            rows = conn.execute(claim, params).fetchall()
            parked = rows[0][-1]
            if rows[0][_ID] is None:
                rows = []
            now = time.monotonic()
            due = [group for group in kept if group.due <= now]
            if not rows and not due:
                if parked or wrote:
                    continue  # it made room, or its write-back may have: look again at once
                if kept:
                    time.sleep(max(min(group.due for group in kept) - now, 0.0))
                    continue
                if not wait_for_next_retry(conn):
                    break  # nothing left to wait for: the caller counts what is missing
                continue
            kept = [group for group in kept if group.due > now]
            groups = [(group.token, group.rows) for group in due]
            done = _publish_keeping([(token, rows), *groups], publisher, retry)
            kept.extend(done.kept)
            carried = done  # written by the next claim (the last one is left: untimed)
        return time.perf_counter() - start


def drain_raw_failing(
    ctx: Context, publisher: Publisher, batch: int, retry: float, *, loop: str = "probing"
) -> float:
    """Run a hand-written relay until ``publisher`` has everything; the seconds it took.

    ``loop``: ``"probing"`` (the floor: nothing parked), ``"parking"`` (parks as the library
    does; a claim, then a write-back, two statements a pass), ``"riding"`` (the bounded
    floor: the parking loop with each pass's write-back riding on the next claim, one statement
    a pass, as the library's relay sends it) or ``"keeping"`` (failed rows stay claimed in the
    relay through their backoff, see the module docs).
    """
    if loop == "keeping":
        return _drain_keeping(ctx, publisher, batch, retry)
    return _drain_handing_back(ctx, publisher, batch, retry, loop)


def _drain_handing_back(
    ctx: Context, publisher: Publisher, batch: int, retry: float, loop: str
) -> float:
    """The loops that hand a failed pass's rows back (see :func:`drain_raw_failing`)."""
    delay = dt.timedelta(seconds=retry)
    carried: RawPass | None = None
    with ctx.raw() as conn:
        start = time.perf_counter()
        while not publisher.done():
            token, params = _new_pass(batch)
            wrote = carried is not None
            if loop == "probing":
                claim = RAW_FAILING_CLAIM
            elif carried is None:
                claim = RAW_PARKING_CLAIM
            else:
                claim = RAW_RIDING_CLAIMS["settle" if carried.failed else "mark"]
                params.update(carried.params("previous", delay))
                carried = None
            rows = conn.execute(claim, params).fetchall()
            if loop != "probing" and rows[0][_ID] is None:
                if rows[0][-1] or wrote:
                    # It parked rows, or its write-back may have unparked some, and it took
                    # none: the next claim sees past them.
                    continue
                rows = []
            if not rows:
                if not wait_for_next_retry(conn):
                    break  # nothing left to wait for: the caller counts what is missing
                continue
            done = publish_rows(rows, token, publisher)
            if loop == "riding":
                carried = done  # written by the next claim (the last one is left: untimed)
            elif loop == "parking":
                conn.execute(
                    RAW_PARKING_SETTLE if done.failed else RAW_PARKING_MARK,
                    done.params("token", delay),
                )
            elif done.failed:
                conn.execute(RAW_SETTLE, done.params("token", delay))
            else:
                conn.execute(RAW_MARK, (done.published, token))
        return time.perf_counter() - start
