"""PostgreSQL through any SQLAlchemy driver: one round trip per step where it can be.

What it does for speed, and why it is safe:

* Every step runs on one connection held across passes (no pool checkout and isolation-level
  reset per step): a single statement in autocommit, a claim's transaction between an explicit
  ``BEGIN`` and ``COMMIT``. Any error drops the connection (the server rolls back what it had
  open); the next step takes a fresh one from the pool.
* While nothing holds its candidates back, a claim is one statement
  (:func:`~sqla_outbox.queries.fast_claim_stmt`) that also carries the previous pass's mark: a
  pass is one round trip plus the publishing. When it finds something held (it takes nothing
  and says ``crowded``), the base store's claim decides in the same pass
  (:mod:`sqla_outbox.plan`). When that claim takes rows past rows it leaves, the next claims are
  one statement again, past what it left (:data:`RESUME_CLAIMS`); when it takes nothing, the
  relay stays on it while claims leave rows held by others. A one-statement claim held back by
  a row in flight before its candidates goes once more, past the first candidate's
  transaction: a second relay finds the next transaction of a large backlog in two statements.
* A pass with a failure writes back in one statement (:func:`~sqla_outbox.queries.settle_stmt`).
* Instants are the server's (:mod:`sqla_outbox.clock`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import Connection, Engine, Executable, text
from sqlalchemy.exc import SQLAlchemyError

from sqla_outbox import plan, queries
from sqla_outbox.analyzing import StaleStatistics
from sqla_outbox.claims import Claimed, WriteBack
from sqla_outbox.logs import log_event
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import as_utc
from sqla_outbox.publishing import PassOutcome
from sqla_outbox.stores.base import SqlStore, done_token
from sqla_outbox.sweeping import Swept

__all__ = ["RESUME_CLAIMS", "PostgresStore"]

log = logging.getLogger("sqla_outbox.relay")

RESUME_CLAIMS = 32
"""One-statement claims a relay makes past the front of the outbox, after rows something held,
before it claims from the front again.

Rows are held by another relay's claim (a large transaction it is publishing) or by a failed
row in its backoff. A relay that finds them held goes on past them: after the transaction of
the last row its planned claim took, after the transaction a one-statement claim found in
flight, or after the transactions of the rows its last pass failed to publish. Claiming from
the front each time would find them held again and pay for it every pass; claiming past them
for good would let rows at the front whose holder has finished wait for ever. After this many
claims, or a claim that finds nothing past where it started, the relay claims from the front
again: a row freed at the front waits at most this many passes.
"""


class PostgresStore(SqlStore):
    """The relay's statements on PostgreSQL, through SQLAlchemy Core (psycopg2, pg8000, or
    psycopg with its fast path off)."""

    can_claim_ahead = True

    def __init__(self, engine: Engine, **settings: Any) -> None:
        super().__init__(engine, **settings)
        self._fast = {
            mark: queries.fast_claim_stmt(self._order, mark=mark) for mark in (False, True)
        }
        self._crowded = False
        """The last claim took nothing and left rows held by others: claim with the plan
        directly."""
        self._after = plan.FRONT
        """Where one-statement claims start: a transaction's start or end, or the front."""
        self._resume_claims = 0
        """One-statement claims left before the relay reads from the front again."""
        self._settle = queries.settle_stmt()
        self._sweep = queries.sweep_stmt()
        self._analyze = queries.analyze_stmt()
        self._stale = StaleStatistics()
        self._session_before: dict[str, Any] = {}

    def can_carry(self, write_back: WriteBack) -> bool:
        """A mark rides on the next claim; a pass with anything more is written on its own."""
        return write_back.mark_only

    def write_back(
        self, claimed: Claimed, outcome: PassOutcome
    ) -> tuple[WriteBack, list[OutboxMessage]]:
        """As the base store's; and the next claims go on past the transactions of the rows
        that failed (:data:`RESUME_CLAIMS`): the rest of each waits for its failed row."""
        write_back, dead = super().write_back(claimed, outcome)
        if outcome.failed:
            last = max(message.staged_at for message, _error in outcome.failed)
            if self._after < (last, plan.LAST_ID):
                self._resume((last, plan.LAST_ID))
        return write_back, dead

    def _retry_params(self, now: dt.datetime, backoff: dt.timedelta) -> dict[str, Any]:
        return {"delay": backoff}

    def sweep(self) -> Swept:
        """The whole sweep as one statement (:func:`~sqla_outbox.queries.sweep_stmt`), then
        ``ANALYZE`` when rows moved in thousands (:mod:`sqla_outbox.analyzing`)."""
        with self._transaction(statements=1) as conn:
            params = self._sweep_params()
            counts = self._rows(self._execute(conn, self._sweep, params))[0]
        swept = Swept(*counts[:3])
        self._advance(params, *counts[3:])
        self._stale.moved(swept.unparked + swept.woken + swept.parked)
        if self._stale.due():
            with self._transaction(statements=1) as conn:
                conn.execute(self._analyze)
            moved = self._stale.analysed()
            log_event(log, logging.INFO, "relay.analyzed", relay=self._relay_id, moved=moved)
        return swept

    # -- claim ---------------------------------------------------------------------------------

    def _claim_once(self, token: str, carried: WriteBack | None) -> Claimed:
        if carried is not None and not self.can_carry(carried):
            self.write(carried)  # the relay never sends one; a caller of the store might
            carried = None
        done = done_token(token, carried)
        unparked = 0
        if not self._crowded:
            claimed = self._claim_fast(token, carried, done)
            if not claimed.crowded:
                return claimed
            carried, unparked = None, claimed.unparked  # the statements wrote it
        claimed = self._planned(token, carried, done)
        claimed.unparked += unparked
        claimed.crowded = True
        self._after = plan.FRONT
        if claimed.held and claimed.messages:
            # Rows before the last one taken were left: go on from its transaction.
            self._resume((claimed.messages[-1].staged_at, plan.FIRST_ID))
        self._crowded = claimed.held > 0 and not claimed.messages
        self._stale.moved(claimed.parked)
        return claimed

    def start_over(self) -> None:
        """The next claim is the one-statement claim, from the front."""
        self._crowded = False
        self._after = plan.FRONT

    def _resume(self, after: plan.Position) -> None:
        """Make the next one-statement claims start after ``after`` (:data:`RESUME_CLAIMS`)."""
        self._after = after
        self._resume_claims = RESUME_CLAIMS

    def _claim_fast(self, token: str, carried: WriteBack | None, done: str) -> Claimed:
        """The one-statement claim with ``carried``'s mark (see :meth:`can_carry`), from where
        the relay is; once more past the first candidate's transaction when a row before the
        candidates is in flight, and from the front when nothing is past where it was."""
        skipped = False
        unparked = 0
        while True:
            resumed = self._after != plan.FRONT
            claimed, skip_to = self._claim_fast_once(token, carried, done)
            carried = None  # the statement wrote it
            unparked += claimed.unparked
            if claimed.crowded and skip_to is not None and not skipped:
                skipped = True
                self._resume((as_utc(skip_to), plan.LAST_ID))
            elif resumed and not claimed.crowded and not claimed.messages:
                self._after = plan.FRONT
            else:
                claimed.unparked = unparked
                return claimed

    def _claim_fast_once(
        self, token: str, carried: WriteBack | None, done: str
    ) -> tuple[Claimed, dt.datetime | None]:
        """One one-statement claim after ``self._after``; with the ``skip_to`` it answered."""
        after_at, after_id = self._after
        if self._after != plan.FRONT:
            self._resume_claims -= 1
            if self._resume_claims <= 0:
                self._after = plan.FRONT
        params: dict[str, Any] = {
            "limit": self._batch_size,
            "token": token,
            "lease": self._lease,
            "done": done,
            "after_staged_at": after_at,
            "after_id": after_id,
        }
        if carried is not None:
            params["previous_ids"] = carried.ids
        header = 2 if carried is None else 4
        with self._transaction(statements=1) as conn:
            rows = self._rows(self._execute(conn, self._fast[carried is not None], params))
        counts = rows[0]
        if carried is not None:
            self._check(carried.token, "mark", expected=len(carried.ids), touched=counts[0])
        claimed = self._decode(token, rows if counts[header] is not None else [], header)
        claimed.crowded = bool(counts[header - 2])
        if carried is not None:
            claimed.unparked = counts[1]
        return claimed, counts[header - 1]

    # -- settle --------------------------------------------------------------------------------

    def write(self, write_back: WriteBack) -> None:
        """A mark alone as its statement; anything more as one :func:`~queries.settle_stmt`."""
        if write_back.mark_only:
            if write_back.ids:
                with self._transaction(statements=1) as conn:
                    self._mark_rows(conn, write_back.token, write_back.ids)
            return
        with self._transaction(statements=1) as conn:
            result = self._execute(
                conn, cast("Executable", self._settle), _settle_params(write_back)
            )
            counts = self._rows(result)[0]
        token = write_back.token
        self._check(token, "mark", expected=len(write_back.ids), touched=counts[0])
        self._check(token, "charge", expected=len(write_back.failures), touched=counts[2])
        handed_back = len(write_back.released) + len(write_back.held)
        self._check(token, "release", expected=handed_back, touched=counts[3] + counts[4])

    def _write_in_steps(self, conn: Connection, write_back: WriteBack) -> None:
        # Only marks are carried (can_carry): the mark statement unparks what its rows held back.
        self._mark_rows(conn, write_back.token, write_back.ids)

    def _mark_rows(self, conn: Connection, token: str, ids: list[uuid.UUID]) -> None:
        if not ids:
            return
        result = self._execute(conn, self._mark, {"token": token, "ids": ids})
        self._check(token, "mark", expected=len(ids), touched=self._rows(result)[0][0])

    # -- connections -----------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, statements: int) -> Iterator[Connection]:
        """The held connection for one pass step: a single statement in autocommit, several
        between ``BEGIN`` and ``COMMIT`` (an error rolls back and drops the connection)."""
        with self._held_step(begin=False) as conn:
            if statements == 1:
                yield conn
                return
            conn.exec_driver_sql("BEGIN")
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(SQLAlchemyError):
                    conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")

    def _open_held(self) -> Connection:
        held = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        # What the session had, restored before the connection goes back to the pool
        # (_reset_held): an application's engine may set either on connect, and RESET would
        # fall back to the server's default instead.
        try:
            # One round trip, as the SET it replaces: the settings as they were, then ours.
            self._session_before = held.execute(_SWAP_SESSION, _RELAY_SESSION).one()._asdict()
        except BaseException:
            held.close()
            raise
        return held

    def _reset_held(self, held: Connection) -> None:
        held.execute(_SET_SESSION, self._session_before)


def _settle_params(write_back: WriteBack) -> dict[str, Any]:
    """The parameters of :func:`~sqla_outbox.queries.settle_stmt` for ``write_back``: the
    handed-back rows as parallel arrays (failed, released, then held back)."""
    failures = write_back.failures
    others = [*write_back.released, *write_back.held]
    unset: Sequence[None] = [None] * len(others)
    return {
        "token": write_back.token,
        "ids": write_back.ids,
        "handed_ids": [*(f["failed_id"] for f in failures), *others],
        "errors": [*(f["error"] for f in failures), *unset],
        "delays": [*(f["delay"] for f in failures), *unset],
        "deads": [*(f["dead"] for f in failures), *unset],
        "parks": [False] * (len(failures) + len(write_back.released))
        + [True] * len(write_back.held),
        "behinds": [None] * (len(failures) + len(write_back.released))
        + list(write_back.held.values()),
    }


_RELAY_SESSION = {"jit": "off", "timezone": "UTC"}
"""The relay's own session settings, on its held connection only.

``jit``: a claim's estimated cost grows with its window and can cross ``jit_above_cost``, where
compiling it would take longer than running it.

``TimeZone``: psycopg returns ``timestamptz`` values in the session's zone, and only a zone
named exactly ``UTC`` comes back as ``datetime.timezone.utc``, which the relay hands to
publishers as it is; under any other zone it would convert two timestamps per claimed row. The
relay's statements compare ``timestamptz`` values only, which no session zone changes.
"""
_SWAP_SESSION = text(
    "SELECT before.jit, before.timezone, set_config('jit', :jit, false), "
    "set_config('TimeZone', :timezone, false) FROM (SELECT current_setting('jit') AS jit, "
    "current_setting('TimeZone') AS timezone OFFSET 0) AS before"
)
"""Read the session's settings, then set ``:jit`` and ``:timezone``. The subquery (kept apart by
``OFFSET 0``) is computed before the outer row's ``set_config`` calls."""
_SET_SESSION = text(
    "SELECT set_config('jit', :jit, false), set_config('TimeZone', :timezone, false)"
)
