"""The relay's statements, executed: claim, mark, charge, hand back, renew, sweep.

:class:`ClaimStatements` runs the statements of :mod:`sqla_outbox.queries` for one relay and
turns their rows into messages; the :class:`~sqla_outbox.Relay` above it keeps the loop and
the pass protocol and never sees SQL or a driver.

What it does for speed, and why it is safe:

* On PostgreSQL a single statement runs in autocommit on one connection held across passes (a
  claim or a mark is one round trip instead of BEGIN + statement + COMMIT, and is atomic on its
  own). Any error drops the connection; the next step takes a fresh one from the pool.
* On PostgreSQL through psycopg every statement is compiled once and sent as driver SQL, with
  psycopg's own parameter adaptation and result values (uuid, jsonb -> dict, timestamptz) read
  straight from the cursor: the claim is the one statement whose rows are many, and
  SQLAlchemy's per-value processing was a fifth of a drain's time (see
  :mod:`sqla_outbox.driver_sql`).
* A pass leaves its write-back to the next claim (:class:`WriteBack`): on PostgreSQL both
  travel in one statement, on SQLite in one transaction. That is the mark of a claim published
  in full, and in key order also the charges and parking of a pass with failures.
* The claim's window (how many candidates it locks to find ``batch_size`` it may take) starts at
  ``batch_size`` and widens by the rows the last claim had to leave (held back by other claims),
  so a relay whose candidates all belong to a transaction another relay is publishing still
  finds the due work behind it, without every claim locking more rows than it takes.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, Engine, Executable, Select, Update
from sqlalchemy.exc import SQLAlchemyError

from sqla_outbox import driver_sql, queries
from sqla_outbox.liveness import Liveness
from sqla_outbox.logs import describe_error, log_event
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import as_utc
from sqla_outbox.publishing import PassOutcome
from sqla_outbox.retries import RetryPolicy
from sqla_outbox.schema_errors import raise_if_missing_table

__all__ = ["ClaimStatements", "Claimed", "WriteBack", "next_window"]

log = logging.getLogger("sqla_outbox.relay")

_FIELDS = len(queries.MESSAGE_FIELDS)
_MAX_WINDOW = 16
"""The widest claim window, in batches: past it a relay waits for the held rows instead."""
_WIDEN_TRIES = 4
"""Claims one pass may make while each finds only held-back rows."""
SWEEP_LIMIT = 1000
"""Parked rows one sweep may unpark (see :func:`sqla_outbox.queries.sweep_parked_stmt`)."""

_as_message = partial(tuple.__new__, OutboxMessage)
"""A claimed row's message values as an :class:`OutboxMessage`, without a Python-level call.

``OutboxMessage._make`` does the same through a Python function and a length check; the claim's
leading columns are :data:`~sqla_outbox.queries.MESSAGE_FIELDS`, so the length is right by
construction (a unit test pins the two together), and a drain builds tens of thousands a second.
"""


def next_window(window: int, batch_size: int, held: int) -> int:
    """The claim window after a claim that had to leave ``held`` rows of its window.

    Back to ``batch_size`` when nothing was held; otherwise doubled until it reaches past the
    held rows, up to :data:`_MAX_WINDOW` batches. Doubling keeps a relay's windows to a few
    multiples of its batch size: each is a claim text of its own (the window is written into
    the SQL, see :mod:`sqla_outbox.driver_sql`), prepared and planned once.
    """
    if not held:
        return batch_size
    window *= 2
    while window < batch_size + held:
        window *= 2
    return min(window, batch_size * _MAX_WINDOW)


@dataclass(frozen=True, slots=True)
class WriteBack:
    """What a pass writes back, fenced on its claim's ``token``: the ``ids`` it published, the
    failures it charges, the rows it hands back (``released``) or parks (``held``).

    Built by :meth:`ClaimStatements.write_back`; written by :meth:`ClaimStatements.write` or,
    riding on it, by the next :meth:`ClaimStatements.claim`.
    """

    token: str
    ids: list[uuid.UUID]
    failures: list[dict[str, Any]] = field(default_factory=list)
    released: list[uuid.UUID] = field(default_factory=list)
    held: list[uuid.UUID] = field(default_factory=list)

    @property
    def mark_only(self) -> bool:
        """Nothing to write but the mark: the pass published its whole claim."""
        return not (self.failures or self.released or self.held)


@dataclass(slots=True)
class Claimed:
    """What one claim took: its messages in claim order, with their failed attempts so far."""

    token: str
    messages: list[OutboxMessage]
    attempts: list[int]
    parked: int = 0
    held: int = 0
    unparked: int = 0
    """Rows the mark written with this claim freed: claimable from the next statement on."""
    crowded: bool = False
    """Something before the claimed rows was not claimable (see ``queries.claim_stmt``)."""
    taken_at: float = field(default_factory=time.monotonic)
    """When the claim came back (``time.monotonic()``); its lease runs from about then."""


class ClaimStatements:
    """Executes one relay's statements on ``engine``. Not thread-safe, except :meth:`renew`:
    the relay serialises its passes, and renewal runs on a connection of its own."""

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
        self._batch_size = batch_size
        self._lease = claim_lease
        self._retry = retry
        self._liveness = liveness
        self._window = batch_size
        dialect = self._dialect = engine.dialect.name
        self._pg = dialect == "postgresql"
        self._claim = queries.claim_stmt(dialect, order)
        # PostgreSQL's claims by (fast, what they carry: nothing, a mark, a whole write-back): a
        # claim writes the previous pass back inside its own statement (SQLite, which allows no
        # UPDATE inside WITH, writes in the claim's transaction and parks in a statement of its
        # own), and the fast claim serves while the last claim found the outbox uncrowded.
        self._carries = (None, "mark", "settle") if order == "key" else (None, "mark")
        self._pg_claims: dict[tuple[bool, str | None], Select[Any] | Update] = (
            {
                (fast, carries): (
                    queries.claim_stmt(dialect, order, fast=fast)
                    if carries is None
                    else queries.mark_and_claim_stmt(order, fast=fast, settle=carries == "settle")
                )
                for fast in (False, True)
                for carries in self._carries
            }
            if self._pg
            else {}
        )
        self._crowded = False
        self._park = None if self._pg else queries.park_stmt(dialect, order)
        self._unpark = None if self._pg else queries.unpark_behind_stmt(dialect)
        self._mark = queries.mark_published_stmt(dialect)
        self._release = queries.release_stmt(dialect)
        self._fail = queries.fail_stmt(dialect)
        self._renew = queries.renew_stmt(dialect)
        self._sweep = queries.sweep_parked_stmt(dialect)
        self._idle = queries.idle_stmt(dialect)
        self._settle = queries.settle_stmt() if self._pg else None
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if self._pg else None
        )
        self._held: Connection | None = None
        self._precompiled: dict[int, driver_sql.Precompiled] = {}
        if driver_sql.applies(engine.dialect, engine.get_execution_options()):
            for statement in (
                self._claim, *self._pg_claims.values(),
                self._mark, self._release, self._fail, self._renew, self._sweep, self._settle,
            ):  # fmt: skip
                if statement is not None:
                    self._precompiled[id(statement)] = driver_sql.precompile(
                        statement, engine.dialect
                    )

    # -- claim ---------------------------------------------------------------------------------

    def can_carry(self, write_back: WriteBack) -> bool:
        """Whether the next claim can write ``write_back`` with it: a mark always; on
        PostgreSQL a pass with failures only in key order (see
        :func:`~sqla_outbox.queries.mark_and_claim_stmt`), on SQLite always (the claim's
        transaction sees the writes before it)."""
        return write_back.mark_only or not self._pg or "settle" in self._carries

    def claim(self, token: str, carried: WriteBack | None) -> Claimed:
        """Claim the next rows (writing ``carried`` with them, see :meth:`can_carry`), widening
        the window while held-back rows fill it.

        A claim that takes nothing but parks or unparks rows has made progress: the next one
        sees further, so it goes again at once (each parks up to a window of rows, so a backlog
        held behind dead letters is parked within a bounded number of claims). A claim whose
        window holds only rows held by live claims of other relays widens the window, doubling
        up to :data:`_MAX_WINDOW` batches, and gives up after :data:`_WIDEN_TRIES` claims that
        changed nothing: those rows wait for their relays.
        """
        idle_tries = 0
        while True:
            claimed = self._claim_once(token, carried)
            carried = None
            progressed = claimed.parked or claimed.unparked
            self._window = next_window(self._window, self._batch_size, claimed.held)
            if claimed.messages or not (claimed.held or progressed):
                return claimed
            idle_tries = 0 if progressed else idle_tries + 1
            if idle_tries >= _WIDEN_TRIES:
                return claimed

    def _params(self, **params: Any) -> dict[str, Any]:
        if not self._pg:
            now = dt.datetime.now(dt.timezone.utc)
            params["now"] = now
            if "lease" in params:
                params["cutoff"] = now - params.pop("lease")
        return params

    def _claim_once(self, token: str, carried: WriteBack | None) -> Claimed:
        params = self._params(
            limit=self._batch_size, window=self._window, lease=self._lease, token=token
        )
        if not self._pg:
            return self._sqlite_claim(token, carried, params)
        fast = not self._crowded and self._window == self._batch_size
        claimed = self._pg_claim(token, carried, params, fast=fast)
        if fast and claimed.crowded:
            # The fast claim took nothing (its mark stands): the full claim sees what holds.
            unparked = claimed.unparked
            claimed = self._pg_claim(token, None, params, fast=False)
            claimed.unparked += unparked
        self._crowded = claimed.crowded
        return claimed

    def _pg_claim(
        self, token: str, carried: WriteBack | None, params: dict[str, Any], *, fast: bool
    ) -> Claimed:
        header = 3
        carries = None
        if carried is not None:
            carries = "mark" if carried.mark_only else "settle"
            params = {**params, **self._write_params(carried, "previous_token", "previous_ids")}
            header += 2 if carried.mark_only else 5
        with self._transaction(statements=1) as conn:
            rows = self._rows(self._execute(conn, self._pg_claims[fast, carries], params))
        counts = rows[0]
        if carried is not None:
            self._check_written(carried, counts)
        claimed = self._decode(token, rows if rows[0][header] is not None else [], header)
        claimed.parked, claimed.held, claimed.crowded = counts[header - 3 : header]
        if carried is not None:
            claimed.unparked = counts[1]
        return claimed

    def _sqlite_claim(
        self, token: str, carried: WriteBack | None, params: dict[str, Any]
    ) -> Claimed:
        with self._transaction(statements=2) as conn:
            if carried is not None:
                self._write_in_steps(conn, carried)
            parked = len(conn.execute(cast("Executable", self._park), params).all())
            rows = self._rows(conn.execute(self._claim, params))
        claimed = self._decode(token, rows, 0)
        # UUID.int compares natively; UUID objects compare through Python-level methods.
        order = sorted(
            range(len(claimed.messages)),
            key=lambda i: (claimed.messages[i].staged_at, claimed.messages[i].id.int),
        )
        claimed.messages = [claimed.messages[i] for i in order]
        claimed.attempts = [claimed.attempts[i] for i in order]
        claimed.parked = parked
        return claimed

    def _rows(self, result: CursorResult[Any]) -> Sequence[Any]:
        if self._precompiled:
            # psycopg's own tuples, read from the cursor: no SQLAlchemy Row per claimed row.
            try:
                return result.cursor.fetchall()
            finally:
                result.close()
        return cast("Sequence[Any]", result.all())  # Rows index like tuples

    def _decode(self, token: str, rows: Sequence[Any], header: int) -> Claimed:
        message_part = itemgetter(slice(header, header + _FIELDS))
        messages = list(map(_as_message, map(message_part, rows)))
        attempts = [row[header + _FIELDS] for row in rows]
        if messages and messages[0].staged_at.tzinfo is not dt.timezone.utc:
            # psycopg's values carry the session's zone (and SQLite's Core rows are UTC already);
            # in a UTC session (use_utc_sessions) the rows are the messages as they are.
            messages = [
                m._replace(run_at=as_utc(m.run_at), staged_at=as_utc(m.staged_at)) for m in messages
            ]
        return Claimed(token, messages, attempts)

    # -- settle --------------------------------------------------------------------------------

    def _mark_rows(self, conn: Connection, token: str, ids: list[uuid.UUID]) -> None:
        params = self._params(token=token, ids=ids)
        result = self._execute(conn, self._mark, params)
        if self._pg:
            marked = self._rows(result)[0][0]
        else:
            marked = result.rowcount
            conn.execute(cast("Executable", self._unpark), {"ids": ids})
        self._check(token, "mark", expected=len(ids), touched=marked)

    @property
    def can_claim_ahead(self) -> bool:
        """Whether a claim may run on another thread while a pass publishes: on PostgreSQL,
        where every claim is one autocommit statement (SQLite claims under its write lock)."""
        return self._pg

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
        steps = bool(write_back.ids) + bool(write_back.failures)
        steps += bool(write_back.released) + bool(write_back.held)
        if not steps:
            return
        if self._pg and steps > 1:
            params = self._write_params(write_back, "token", "ids")
            with self._transaction(statements=1) as conn:
                counts = self._rows(self._execute(conn, cast("Executable", self._settle), params))
            self._check_written(write_back, counts[0])
            return
        with self._transaction(statements=1 if self._pg else 2) as conn:
            self._write_in_steps(conn, write_back)

    def _write_params(self, write_back: WriteBack, token: str, ids: str) -> dict[str, Any]:
        """PostgreSQL: the parameters of a write-back as one statement (``queries.settle_stmt``,
        or riding on a claim, ``queries.mark_and_claim_stmt``)."""
        params: dict[str, Any] = {token: write_back.token, ids: write_back.ids}
        if write_back.mark_only:
            return params
        failures = write_back.failures
        failed_ids = [f["failed_id"] for f in failures]
        params.update(
            failed_ids=failed_ids,
            errors=[f["error"] for f in failures],
            delays=[f["delay"] for f in failures],
            deads=[f["dead"] for f in failures],
            released_ids=write_back.released,
            held_ids=write_back.held,
            kept_ids=[*failed_ids, *write_back.released, *write_back.held],
        )
        return params

    def _check_written(self, write_back: WriteBack, counts: Sequence[Any]) -> None:
        """Log a lost claim unless a write-back's counts (``marked, unparked`` and, for more
        than a mark, ``charged, released, held_back``) touched every row it named."""
        token = write_back.token
        self._check(token, "mark", expected=len(write_back.ids), touched=counts[0])
        if write_back.mark_only:
            return
        self._check(token, "charge", expected=len(write_back.failures), touched=counts[2])
        handed_back = len(write_back.released) + len(write_back.held)
        self._check(token, "release", expected=handed_back, touched=counts[3] + counts[4])

    def _write_in_steps(self, conn: Connection, write_back: WriteBack) -> None:
        """The write-back as statements of the caller's transaction (SQLite; PostgreSQL's
        single step)."""
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

    def _failures(self, claimed: Claimed, outcome: PassOutcome) -> list[dict[str, Any]]:
        before = dict(zip((m.id for m in claimed.messages), claimed.attempts, strict=True))
        now = dt.datetime.now(dt.timezone.utc)
        failures = []
        for message, error in outcome.failed:
            attempts = before[message.id] + 1
            backoff = self._retry.backoff(attempts)
            params = {
                "token": claimed.token,
                "failed_id": message.id,
                "error": describe_error(error)[:2000],
                "dead": self._retry.gives_up(attempts),
                "attempts": attempts,
                "backoff": backoff,
            }
            if self._pg:
                params["delay"] = backoff
            else:
                params.update(now=now, retry_at=now + backoff)
            failures.append(params)
        return failures

    # -- renewal and sweeps ----------------------------------------------------------------------

    def renew(self, token: str, ids: Sequence[uuid.UUID]) -> int:
        """Renew a claim's lease; how many rows it still holds. Safe from another thread: it
        runs on a connection of its own."""
        with raise_if_missing_table(self.engine), self.engine.begin() as conn:
            params = self._params(token=token, ids=list(ids))
            return self._execute(conn, self._renew, params).rowcount

    def idle_plan(self) -> tuple[float | None, int]:
        """Seconds until the next row comes due, a backoff ends or a claim lapses (None: none
        pending), and how many rows are parked; for the idle loop's wait."""
        with self._transaction(statements=1) as conn:
            row = conn.execute(self._idle, self._params()).one()
        lapse = None if row.oldest_claim is None else row.oldest_claim + self._lease
        times = [t for t in (row.next_run_at, row.next_retry_at, lapse) if t is not None]
        now = as_utc(row.now)
        due_in = None if not times else max(0.0, (min(map(as_utc, times)) - now).total_seconds())
        return due_in, int(row.parked)

    def sweep(self) -> int:
        """Unpark rows that nothing stuck holds back any more; how many."""
        with self._transaction(statements=1) as conn:
            params = self._params(limit=SWEEP_LIMIT)
            return self._execute(conn, self._sweep, params).rowcount

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
        precompiled = self._precompiled.get(id(statement))
        if precompiled is None:
            return conn.execute(statement, params)
        if isinstance(params, list):
            batch = [precompiled.params(p) for p in params]
            return conn.exec_driver_sql(precompiled.text(params[0]), batch)
        return conn.exec_driver_sql(precompiled.text(params), precompiled.params(params))

    @contextmanager
    def _transaction(self, statements: int) -> Iterator[Connection]:
        """A connection for one pass step: autocommit for a single statement on PostgreSQL.

        Single statements reuse one connection held across passes, saving a pool checkout and
        an isolation-level reset per statement. Any error drops it; the next step takes a fresh
        one from the pool.
        """
        with raise_if_missing_table(self.engine):
            if statements == 1 and self._autocommit is not None:
                if self._held is None:
                    self._held = self._autocommit.connect()
                    # The claim's ordering guard is a recursive query over the window; its cost
                    # estimate grows with the square of the window and crosses jit_above_cost
                    # at about 1,000 rows, where compiling it takes 20-800 ms of a claim that
                    # runs in 7. Off for this connection only, and reset before it goes back
                    # to the pool (drop_connection). (force_generic_plan, which would save the
                    # half millisecond of planning, measured slower at 1,000-row batches.)
                    self._held.exec_driver_sql("SET jit = off")
                try:
                    yield self._held
                except BaseException:
                    self.drop_connection()
                    raise
                self._liveness.reached_database()
                return
            with self.engine.begin() as conn:
                yield conn
            self._liveness.reached_database()

    def drop_connection(self) -> None:
        """Let go of the connection held between passes."""
        held, self._held = self._held, None
        if held is not None:
            try:
                if not held.invalidated:
                    held.exec_driver_sql("RESET jit")
                held.close()
            except SQLAlchemyError:
                log.debug("closing a broken relay connection failed", exc_info=True)
