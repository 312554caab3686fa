"""The store every database's store builds on: the relay's statements through SQLAlchemy Core.

:class:`SqlStore` runs the statements of :mod:`sqla_outbox.queries` for one relay, each step in
a transaction of its own (``engine.begin()``), and turns their rows into messages. The
:class:`~sqla_outbox.Relay` above it keeps the loop and the pass protocol and never sees SQL, a
dialect or a driver. What differs between databases is the claim (one statement on PostgreSQL,
a write-locked transaction on SQLite, lock-read-stamp on MySQL) and what each can do for speed;
each subclass in this package overrides only that.

Every write after the claim is fenced on the claim's token (see :mod:`sqla_outbox.queries`), so
a relay that stalled past its lease changes nothing another relay holds now.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, CursorResult, Engine, Executable, Select, Update
from sqlalchemy.exc import SQLAlchemyError

from sqla_outbox import queries, waiting
from sqla_outbox.claims import Claimed, WriteBack, next_window
from sqla_outbox.listener import NotificationListener
from sqla_outbox.liveness import Liveness
from sqla_outbox.logs import describe_error, log_event
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import as_utc
from sqla_outbox.publishing import PassOutcome
from sqla_outbox.retries import RetryPolicy
from sqla_outbox.schema_errors import raise_if_missing_table
from sqla_outbox.sweeping import ParkedCursor, Swept

__all__ = ["SWEEP_LIMIT", "SqlStore"]

log = logging.getLogger("sqla_outbox.relay")

_FIELDS = len(queries.MESSAGE_FIELDS)
_WIDEN_TRIES = 4
"""Claims one pass may make while each finds only held-back rows."""
SWEEP_LIMIT = 10_000
"""Parked rows one sweep reads, and so may unpark (:func:`sqla_outbox.queries.parked_window`)."""

_as_message = partial(tuple.__new__, OutboxMessage)
"""A claimed row's message values as an :class:`OutboxMessage`, without a Python-level call.

``OutboxMessage._make`` does the same through a Python function and a length check; the claim's
leading columns are :data:`~sqla_outbox.queries.MESSAGE_FIELDS`, so the length is right by
construction (a unit test pins the two together), and a drain builds tens of thousands a second.
"""


class SqlStore:
    """One relay's statements on ``engine``, each step a transaction through SQLAlchemy Core.

    Not thread-safe, except :meth:`renew`: the relay serialises its passes, and renewal runs on
    a connection of its own. Subclasses provide :meth:`_claim_once`.
    """

    can_claim_ahead = False
    """Whether a claim may run on another thread while a pass publishes (see
    :mod:`sqla_outbox.overlap`): only where every claim is one autocommit statement."""

    def __init__(
        self,
        engine: Engine,
        *,
        relay_id: str,
        order: str,
        batch_size: int,
        claim_lease: dt.timedelta,
        retry: RetryPolicy,
        liveness: Liveness,
    ) -> None:
        self.engine = engine
        self._relay_id = relay_id
        self._order = order
        self._batch_size = batch_size
        self._lease = claim_lease
        self._retry = retry
        self._liveness = liveness
        self._window = batch_size
        self._held: Connection | None = None
        """A connection kept across passes by stores whose steps use one (see
        :meth:`_held_connection`)."""
        dialect = self._dialect = engine.dialect.name
        self._mark = queries.mark_published_stmt(dialect)
        self._unpark = queries.unpark_behind_stmt(dialect)
        self._release = queries.release_stmt(dialect)
        self._fail = queries.fail_stmt(dialect)
        self._renew = queries.renew_stmt(dialect)
        self._sweep: Update | Select[Any] = queries.sweep_parked_stmt(dialect)
        """The sweep's first statement here (on MySQL and MariaDB the read of what it unparks);
        the whole sweep where a store runs it as one."""
        self._window_end = queries.window_end_stmt(queries.parked_window().subquery("parked_row"))
        self._parked_cursor = ParkedCursor()
        self._park_waiting = queries.park_waiting_stmt(dialect)
        self._wake = queries.wake_stmt(dialect)
        self._idle = queries.idle_stmt(dialect)

    def listener(self, wake: Callable[[], None], relay_id: str) -> NotificationListener | None:
        """What wakes an idle relay when a commit stages rows; None: it polls."""
        return None

    # -- claim ---------------------------------------------------------------------------------

    def can_carry(self, write_back: WriteBack) -> bool:
        """Whether the next claim can write ``write_back`` with it. Here always: the claim's
        transaction writes it first and then sees what it wrote."""
        return True

    def claim(self, token: str, carried: WriteBack | None) -> Claimed:
        """Claim the next rows (writing ``carried`` with them, see :meth:`can_carry`), widening
        the window while held-back rows fill it.

        A claim that takes nothing but parks or unparks rows has made progress: the next one
        sees further, so it goes again at once (each parks up to a window of rows, so a backlog
        held behind dead letters is parked within a bounded number of claims). A claim whose
        window holds only rows held by live claims of other relays widens the window, doubling
        up to ``claims._MAX_WINDOW`` batches, and gives up after :data:`_WIDEN_TRIES` claims
        that changed nothing: those rows wait for their relays.
        """
        idle_tries = 0
        while True:
            claimed = self._claim_once(token, carried, self._claim_params(token))
            carried = None
            progressed = claimed.parked or claimed.unparked
            # A claim that took rows widens only for those it left unparked; one that took
            # nothing widens for all (a backlog parked behind dead letters is parked a wider
            # window at a time).
            held = claimed.held_unparked if claimed.messages else claimed.held
            self._window = next_window(self._window, self._batch_size, held)
            if claimed.messages or not (claimed.held or progressed):
                return claimed
            idle_tries = 0 if progressed else idle_tries + 1
            if idle_tries >= _WIDEN_TRIES:
                return claimed

    def _claim_params(self, token: str) -> dict[str, Any]:
        return self._params(
            limit=self._batch_size, window=self._window, lease=self._lease, token=token
        )

    def _claim_once(self, token: str, carried: WriteBack | None, params: dict[str, Any]) -> Claimed:
        raise NotImplementedError

    def _params(self, **params: Any) -> dict[str, Any]:
        """``params`` with the instants a statement compares with: ``now`` and, for a claim,
        ``cutoff`` (``now - lease``), for a sweep ``park_after`` and ``wake_before``, all
        computed here in UTC. (PostgreSQL's store uses the server's clock instead.)"""
        now = dt.datetime.now(dt.timezone.utc)
        params["now"] = now
        if "lease" in params:
            params["cutoff"] = now - params.pop("lease")
        if "park_ahead" in params:  # a sweep's (see queries.park_waiting_stmt)
            params["park_after"] = now + params.pop("park_ahead")
            params["wake_before"] = now + params.pop("wake_ahead")
        return params

    def _rows(self, result: CursorResult[Any]) -> Sequence[Any]:
        return result.all()  # Rows index like tuples

    def _decode(self, token: str, rows: Sequence[Any], header: int) -> Claimed:
        """``rows`` (``header`` leading columns, then :data:`~queries.CLAIM_FIELDS`) as a claim."""
        message_part = itemgetter(slice(header, header + _FIELDS))
        messages = list(map(_as_message, map(message_part, rows)))
        attempts = [row[header + _FIELDS] for row in rows]
        if messages and messages[0].staged_at.tzinfo is not dt.timezone.utc:
            # A driver's values may carry the session's zone; in a UTC session (and from the
            # column type, which gives UTC) the rows are the messages as they are.
            messages = [
                m._replace(run_at=as_utc(m.run_at), staged_at=as_utc(m.staged_at)) for m in messages
            ]
        return Claimed(token, messages, attempts)

    # -- settle --------------------------------------------------------------------------------

    def release(self, claimed: Claimed) -> None:
        """Hand ``claimed`` back unpublished and uncharged (a claim taken ahead of a pass that
        stopped; see :mod:`sqla_outbox.overlap`)."""
        self.settle(claimed, PassOutcome(handed_back=list(claimed.messages)))

    def settle(self, claimed: Claimed, outcome: PassOutcome) -> list[OutboxMessage]:
        """Write back one pass now (see :meth:`write_back`); the failed messages that became
        dead letters."""
        write_back, dead = self.write_back(claimed, outcome)
        self.write(write_back)
        return dead

    def write_back(
        self, claimed: Claimed, outcome: PassOutcome
    ) -> tuple[WriteBack, list[OutboxMessage]]:
        """What one pass must write back: mark what was published, charge what failed (retry
        backoff or dead letter), park what a failure held back, hand back the rest at once;
        with the failed messages that become dead letters. Each failure is logged here."""
        failures = self._failures(claimed, outcome) if outcome.failed else []
        dead = []
        for (message, _error), params in zip(outcome.failed, failures, strict=True):
            if params["dead"]:
                dead.append(message)
            log_event(
                log,
                logging.WARNING,
                "relay.dead_letter" if params["dead"] else "relay.publish_failed",
                relay=self._relay_id,
                job=message.job,
                id=message.id,
                queue=message.queue,
                ordering_key=message.ordering_key,
                attempts=params["attempts"],
                retry_in=None if params["dead"] else params["backoff"].total_seconds(),
                error=params["error"],
            )
        write_back = WriteBack(
            claimed.token,
            [m.id for m in outcome.published],
            failures,
            [m.id for m in outcome.handed_back],
            [m.id for m in outcome.held_back],
        )
        return write_back, dead

    def write(self, write_back: WriteBack) -> None:
        """Write ``write_back`` in one transaction (before the loop waits, stops or gives up,
        or when the next claim cannot carry it), fenced on its claim."""
        if write_back.ids or write_back.failures or write_back.released or write_back.held:
            with self._transaction(statements=2) as conn:
                self._write_in_steps(conn, write_back)

    def _write_in_steps(self, conn: Connection, write_back: WriteBack) -> None:
        """The write-back as statements of the caller's transaction."""
        token = write_back.token
        if write_back.ids:
            self._mark_rows(conn, token, write_back.ids)
        if write_back.failures:
            result = self._execute(conn, self._fail, write_back.failures)
            self._check(token, "charge", expected=len(write_back.failures), touched=result.rowcount)
        for ids, park in ((write_back.released, False), (write_back.held, True)):
            if ids:
                params = self._params(token=token, ids=ids, park=park)
                result = self._execute(conn, self._release, params)
                self._check(token, "release", expected=len(ids), touched=result.rowcount)

    def _mark_rows(self, conn: Connection, token: str, ids: list[uuid.UUID]) -> None:
        """Mark ``ids`` published and unpark what they held back."""
        result = self._execute(conn, self._mark, self._params(token=token, ids=ids))
        self._check(token, "mark", expected=len(ids), touched=result.rowcount)
        self._unpark_behind(conn, ids)

    def _unpark_behind(self, conn: Connection, ids: list[uuid.UUID]) -> None:
        """Unpark the rows parked behind ``ids``, just marked published."""
        conn.execute(self._unpark, {"ids": ids})

    def _failures(self, claimed: Claimed, outcome: PassOutcome) -> list[dict[str, Any]]:
        now = dt.datetime.now(dt.timezone.utc)
        failures = []
        before = claimed.attempts_of([message for message, _error in outcome.failed])
        for (message, error), tried in zip(outcome.failed, before, strict=True):
            attempts = tried + 1
            backoff = self._retry.backoff(attempts)
            params = {
                "token": claimed.token,
                "failed_id": message.id,
                "error": describe_error(error)[:2000],
                "dead": self._retry.gives_up(attempts),
                "attempts": attempts,
                "backoff": backoff,
            }
            params.update(self._retry_params(now, backoff))
            failures.append(params)
        return failures

    def _retry_params(self, now: dt.datetime, backoff: dt.timedelta) -> dict[str, Any]:
        """What :func:`~queries.fail_stmt` needs to compute a failed row's ``retry_at``."""
        return {"now": now, "retry_at": now + backoff}

    # -- renewal and sweeps ----------------------------------------------------------------------

    def renew(self, token: str, ids: Sequence[uuid.UUID]) -> int:
        """Renew a claim's lease; how many rows it still holds. Safe from another thread: it
        runs on a connection of its own."""
        with raise_if_missing_table(self.engine), self.engine.begin() as conn:
            params = self._params(token=token, ids=list(ids))
            return self._execute(conn, self._renew, params).rowcount

    def idle_plan(self) -> tuple[float | None, bool]:
        """Seconds until the next row comes due, a backoff ends or a claim lapses (None: none
        pending), and whether any row is parked; for the idle loop's wait."""
        with self._transaction(statements=1) as conn:
            row = conn.execute(self._idle, self._params()).one()
        lapse = None if row.oldest_claim is None else row.oldest_claim + self._lease
        times = [t for t in (row.next_run_at, row.next_retry_at, lapse) if t is not None]
        now = as_utc(row.now)
        due_in = None if not times else max(0.0, (min(map(as_utc, times)) - now).total_seconds())
        return due_in, bool(row.parked)

    def sweep(self) -> Swept:
        """Unpark rows that nothing stuck holds back any more, wake the rows parked until due
        that are due soon, and park those due much later at the head of the claim's index
        (:mod:`sqla_outbox.waiting`): one transaction, which also reads where the window of
        parked rows it looked at ended, to move the cursor on (:class:`ParkedCursor`)."""
        params = self._sweep_params()
        with self._transaction(statements=4) as conn:
            end = self._execute(conn, self._window_end, params).one_or_none()
            unparked = self._unpark_free(conn, params)
            # Parking before waking, as in PostgreSQL's one statement: a row is never parked
            # by the sweep that woke it.
            parked = self._park_waiting_rows(conn, params)
            woken = self._execute(conn, self._wake, params).rowcount
        self._advance(params, *(end or (None, None, 0)))
        return Swept(unparked, woken, parked)

    def _unpark_free(self, conn: Connection, params: dict[str, Any]) -> int:
        """Unpark the rows of the sweep's window that nothing holds back; how many."""
        return self._execute(conn, self._sweep, params).rowcount

    def _advance(
        self, params: dict[str, Any], last_staged_at: Any, last_id: Any, read: int
    ) -> None:
        """Move the parked rows' cursor past the window a sweep with ``params`` read."""
        last = None if last_staged_at is None else as_utc(last_staged_at)
        self._parked_cursor.advance(last, last_id, read, params["limit"])

    def _park_waiting_rows(self, conn: Connection, params: dict[str, Any]) -> int:
        """Park the rows not due for a while at the head of the claim's index; how many."""
        return self._execute(conn, self._park_waiting, params).rowcount

    def _sweep_params(self) -> dict[str, Any]:
        return self._params(
            limit=SWEEP_LIMIT,
            head=waiting.HEAD_ROWS,
            park_ahead=waiting.PARK_AHEAD,
            wake_ahead=waiting.WAKE_AHEAD,
            **self._parked_cursor.params(),
        )

    # -- connections -----------------------------------------------------------------------------

    def _check(self, token: str, action: str, *, expected: int, touched: int) -> None:
        if touched != expected:
            # Another relay reclaimed rows after this claim's lease lapsed. Its work stands;
            # ours is dropped. Rows we published but could not mark may be published twice.
            log_event(
                log,
                logging.WARNING,
                "relay.claim_lost",
                relay=self._relay_id,
                claim=token,
                action=action,
                expected=expected,
                touched=touched,
            )

    def _execute(self, conn: Connection, statement: Executable, params: Any) -> CursorResult[Any]:
        return conn.execute(statement, params)

    @contextmanager
    def _transaction(self, statements: int) -> Iterator[Connection]:
        """A connection in a transaction for one pass step of ``statements`` statements."""
        with raise_if_missing_table(self.engine), self.engine.begin() as conn:
            yield conn
        self._liveness.reached_database()

    @contextmanager
    def _held_step(self, *, begin: bool) -> Iterator[Connection]:
        """One step on the connection held across passes (:meth:`_held_connection`), in a
        transaction of its own with ``begin``; any error drops the connection."""
        with raise_if_missing_table(self.engine):
            held = self._held_connection()
            try:
                if begin:
                    with held.begin():
                        yield held
                else:
                    yield held
            except BaseException:
                self.drop_connection()
                raise
        self._liveness.reached_database()

    def _held_connection(self) -> Connection:
        """The connection kept across passes, opened by :meth:`_open_held` when there is none.

        A store that sets up its session (an isolation level, a planner setting) does it once
        per connection instead of once per step. Its steps drop it on any error
        (:meth:`drop_connection`); the next step takes a fresh one from the pool.
        """
        if self._held is None:
            self._held = self._open_held()
        return self._held

    def _open_held(self) -> Connection:
        """A connection from the pool, set up for this store's steps."""
        return self.engine.connect()

    def _reset_held(self, held: Connection) -> None:
        """Undo on ``held`` what :meth:`_open_held` set that the pool would not reset."""

    def drop_connection(self) -> None:
        """Let go of the connection held between passes, if any."""
        held, self._held = self._held, None
        if held is not None:
            try:
                if not held.invalidated:
                    self._reset_held(held)
                held.close()
            except SQLAlchemyError:
                log.debug("closing a broken relay connection failed", exc_info=True)
