"""The store every database's store builds on: the relay's statements through SQLAlchemy Core.

:class:`SqlStore` runs the statements of :mod:`sqla_outbox.queries` for one relay, each step in
a transaction of its own (``engine.begin()``), and turns their rows into messages. The
:class:`~sqla_outbox.Relay` above it keeps the loop and the pass protocol and never sees SQL, a
dialect or a driver.

A claim is one transaction here, on every database: lock a window of candidates with their
predecessors, read the holders, decide with :mod:`sqla_outbox.plan`, stamp and park by id
(:mod:`sqla_outbox.queries.claim`). What differs between databases is how a transaction is held
(SQLite's write lock, MySQL's ``READ COMMITTED``, PostgreSQL's held connection) and what each
can do for speed (PostgreSQL's one-statement claim while nothing is crowded); each subclass in
this package overrides only that.

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

from sqla_outbox import clock, plan, queries, waiting
from sqla_outbox.claims import Claimed, WriteBack
from sqla_outbox.liveness import Liveness
from sqla_outbox.logs import describe_error, log_event
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import as_utc
from sqla_outbox.publishing import PassOutcome
from sqla_outbox.retries import RetryPolicy
from sqla_outbox.schema_errors import raise_if_missing_table
from sqla_outbox.stores.listener import NotificationListener
from sqla_outbox.sweeping import ParkedCursor, Swept

__all__ = ["SWEEP_LIMIT", "SqlStore"]

log = logging.getLogger("sqla_outbox.relay")

_FIELDS = len(queries.MESSAGE_FIELDS)
_STAGED_AT = queries.MESSAGE_FIELDS.index("staged_at")
_ORDERING_KEY = queries.MESSAGE_FIELDS.index("ordering_key")
_CLAIM = len(queries.CLAIM_FIELDS)
"""Where a window row's links start: after the claim's fields."""
_PARKING_TRIES = 4
"""Claims one call may make while each takes nothing but parks or unparks rows."""
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
    a connection of its own.
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
        self._held: Connection | None = None
        """A connection kept across passes by stores whose steps use one (see
        :meth:`_held_connection`)."""
        dialect = self._dialect = engine.dialect.name
        self._window = queries.window_stmt(dialect, order)
        self._holders = queries.holders_stmt(dialect)
        self._stamp = queries.stamp_stmt(dialect)
        self._park_rows = queries.park_rows_stmt(dialect)
        self._unpark_rows = queries.unpark_rows_stmt(dialect)
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

    def start_over(self) -> None:
        """Forget what earlier claims found, as a relay that just started would: the next
        claim starts from the front of the outbox. This store keeps nothing between claims."""

    def claim(self, token: str, carried: WriteBack | None) -> Claimed:
        """Claim the next rows, writing ``carried`` with them (see :meth:`can_carry`).

        A claim that takes nothing but parks or unparks rows has made progress: the next one
        sees past the rows it parked, or the rows the mark it carried freed, so it goes again at
        once, a bounded number of times (:data:`_PARKING_TRIES`).
        """
        tries = 0
        while True:
            claimed = self._claim_once(token, carried)
            carried = None
            tries += 1
            moved = claimed.parked or claimed.unparked
            if claimed.messages or not moved or tries >= _PARKING_TRIES:
                return claimed

    def _claim_once(self, token: str, carried: WriteBack | None) -> Claimed:
        return self._planned(token, carried, done_token(token, carried))

    def _planned(self, token: str, carried: WriteBack | None, done: str) -> Claimed:
        """One claim as one transaction: the carried write-back, then :meth:`_plan_claim`."""
        with self._transaction(statements=4) as conn:
            if carried is not None:
                self._write_in_steps(conn, carried)
            return self._plan_claim(conn, token, done)

    def _plan_claim(self, conn: Connection, token: str, done: str) -> Claimed:
        """Claim on ``conn``, in its transaction: read windows of candidates with their
        predecessors and the holders, decide with :func:`sqla_outbox.plan.claim_windows`, stamp
        what it takes and park what waits for a stuck row (see :mod:`sqla_outbox.queries.claim`).

        ``done``: the token of a claim whose rows count as published.
        """
        params = self._params(lease=self._lease, done=done, stuck_ahead=plan.PARK_AFTER)
        rows: dict[uuid.UUID, Sequence[Any]] = {}

        def read(after: plan.Position | None, size: int) -> list[plan.Links]:
            at, after_id = after or plan.FRONT
            window = {**params, "window": size, "after_staged_at": at, "after_id": after_id}
            read_rows = self._read_window(conn, window)
            links = []
            for row in read_rows:
                rows[row[0]] = row
                links.append(plan.Links(row[0], row[_STAGED_AT], row[_ORDERING_KEY], *row[_CLAIM:]))
            return links

        def holders_of(ids: set[uuid.UUID]) -> dict[uuid.UUID, plan.Holder]:
            holders = self._execute(conn, self._holders, {**params, "ids": list(ids)})
            return {row[0]: plan.Holder(*row) for row in self._rows(holders)}

        _candidates, decided = plan.claim_windows(read, holders_of, limit=self._batch_size)
        if decided.take:
            stamp = {**params, "ids": decided.take, "token": token}
            self._execute(conn, self._stamp, stamp)
        parked, left = self._park(conn, decided.park, holders_of)
        claimed = self._decode(token, [rows[row_id] for row_id in decided.take], 0)
        claimed.parked = parked
        claimed.held = len(decided.leave) + left
        if decided.unpark:
            unpark = {"ids": list(decided.unpark)}
            claimed.unparked = self._execute(conn, self._unpark_rows, unpark).rowcount
        return claimed

    def _read_window(self, conn: Connection, params: dict[str, Any]) -> Sequence[Any]:
        """Lock and read one window of candidates: the claim's fields, then each row's links
        (:func:`~sqla_outbox.queries.window_stmt`)."""
        return self._rows(self._execute(conn, self._window, params))

    def _park(
        self,
        conn: Connection,
        park: dict[uuid.UUID, uuid.UUID],
        holders_of: Callable[[set[uuid.UUID]], dict[uuid.UUID, plan.Holder]],
    ) -> tuple[int, int]:
        """Park the rows of ``park`` behind the rows they wait for; how many were parked, and
        how many left instead, their holder published since it was read (another relay
        published it, and unparked what waited for it: parked behind it now, a row would wait
        for the sweep)."""
        parking = _grouped(park)
        if not parking:
            return 0, 0
        waited_for = holders_of({behind for behind in parking if behind is not None})
        parked = left = 0
        for behind, ids in parking.items():
            holder = waited_for.get(behind) if behind is not None else None
            if holder is None or holder.published:
                left += len(ids)
                continue
            self._execute(conn, self._park_rows, {"ids": ids, "behind": behind})
            parked += len(ids)
        return parked, left

    def _params(self, **params: Any) -> dict[str, Any]:
        """``params`` with the instants a statement compares with, by whose clock rules
        (:func:`sqla_outbox.clock.instants`)."""
        return clock.instants(self._dialect, params)

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
            {m.id: outcome.waits_for[m.id] for m in outcome.held_back},
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
        releases: dict[uuid.UUID | None, list[uuid.UUID]] = {}
        if write_back.released:
            releases[None] = write_back.released
        releases.update(_grouped(write_back.held))
        for behind, ids in releases.items():
            params = {"token": token, "ids": ids, "park": behind is not None, "behind": behind}
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
        """What :func:`~queries.fail_stmt` needs to compute a failed row's ``retry_at``: the
        instants, where this host's clock rules (:mod:`sqla_outbox.clock`)."""
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


def done_token(token: str, carried: WriteBack | None) -> str:
    """The token of the claim whose rows a new claim ``token`` counts as published: the claim
    whose mark it carries (a claim taken ahead carries the mark of nothing for the claim being
    published meanwhile, :mod:`sqla_outbox.overlap`), else its own, which no row carries yet."""
    if carried is not None and carried.mark_only:
        return carried.token
    return token


def _grouped(behind: dict[uuid.UUID, uuid.UUID]) -> dict[uuid.UUID | None, list[uuid.UUID]]:
    """Rows to park (row -> the row it waits for), as the rows parked behind each."""
    groups: dict[uuid.UUID | None, list[uuid.UUID]] = {}
    for row_id, holder in behind.items():
        groups.setdefault(holder, []).append(row_id)
    return groups
