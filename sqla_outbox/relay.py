"""The relay: claim committed rows, publish them in order, mark them published, fenced.

A pass is three short transactions with the publishing in between, outside any transaction:

1. **Claim** (one statement, see :func:`~sqla_outbox.queries.claim_stmt`): lease up to
   ``batch_size`` due rows in claim order, stamping ``claimed_by`` with a fence token minted for
   *this claim* (``<relay_id>:<random>``) and ``claimed_at`` with the database's clock.
2. **Publish** each message in claim order. The first failure stops the pass: a later message
   must never overtake an earlier one that has not gone out (a ``charge_card`` staged after
   ``create_invoice`` must not run first). A poisoned row therefore holds up the rows behind it,
   visibly, in ``pending()`` and ``sqla-outbox status``; that is the price of order.
3. **Mark and release** (one transaction): the published prefix is marked published and the
   rest of the claim is handed back at once, recording the error on the row that failed, so the
   rest is claimable immediately rather than after the lease.

A publisher fails by raising anything at all: a ``BaseException`` such as an
``asyncio.CancelledError`` escaping a client is a failed publish like any ``Exception``. Only
``KeyboardInterrupt`` and ``SystemExit`` are passed on, after the pass marks what went out and
hands the rest back. The loops of ``start()`` and ``run()`` outlive every other error as well,
logging it and retrying with capped backoff; :meth:`Relay.is_alive` says whether one is running
and reaching the database (:mod:`sqla_outbox.liveness`).

A loop working through a backlog (``drain()``, ``start()``, ``run()``) defers the mark of a
claim it published in full to the claim that follows at once: on PostgreSQL both travel in one
statement (:func:`~sqla_outbox.queries.mark_and_claim_stmt`), on SQLite in one transaction. A
pass is then one round trip plus the publishing. A mark is never left waiting: before the loop
sleeps, stops, or gives up after an error, it writes the mark on its own.

Every update after the claim is fenced on the claim's token. A relay that stalls past its lease
(GC pause, stuck broker call) wakes into a world where another relay has reclaimed its rows;
its late mark or release then matches nothing and is logged as a lost claim, instead of
retiring rows the other relay has not published yet or freeing rows it is publishing. Because
the token is per claim, even a relay that reclaims its own lapsed rows is fenced from its past.

Delivery is at least once: a relay killed between publish and mark leaves rows that another
relay publishes again after the lease. Consumers deduplicate on ``idempotency_key``.

``claim_lease`` bounds only how long a dead relay's rows wait; all relays of a deployment must
share one lease (a relay with a shorter lease would steal live claims of the others).
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import signal
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from types import FrameType
from typing import Any, NoReturn, cast

from sqlalchemy import Connection, CursorResult, Engine, Executable
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from sqla_outbox import driver_sql, queries
from sqla_outbox.engines import hide_password
from sqla_outbox.errors import ConfigurationError, PublishError
from sqla_outbox.listener import NotificationListener, can_listen
from sqla_outbox.liveness import Liveness, liveness_bound
from sqla_outbox.logs import log_event, logfmt
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import as_utc
from sqla_outbox.notify import subscribe, unsubscribe
from sqla_outbox.preflight import RELAY_PRIVILEGES, check_outbox_table, engine_from_url, relay_bind
from sqla_outbox.publishers import PublisherLike, batch_function, publish_function
from sqla_outbox.schema_errors import raise_if_missing_table
from sqla_outbox.settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CLAIM_LEASE,
    DEFAULT_POLL_INTERVAL,
    resolve_batch_size,
    resolve_claim_lease,
    resolve_poll_interval,
)

__all__ = ["PassResult", "Relay"]

log = logging.getLogger("sqla_outbox.relay")

MAX_BACKOFF = 10.0
"""Seconds, the longest the loop waits before retrying after a database error or failed publish."""

_ENDS_PROCESS = (KeyboardInterrupt, SystemExit)
"""What a publisher may raise that is not a failed publish but a request to stop.

Every other ``BaseException`` is a failed publish like any ``Exception``: an
``asyncio.CancelledError`` escaping a client's event loop (or ``GeneratorExit``) says that message
did not go out, not that the relay should end. These two still end the caller (``tick()``,
``drain()``, ``run()``, the thread of ``start()``), after the pass marks what went out and hands
the rest back with nothing recorded against the row, as a graceful stop does.
"""

_MAX_RELAY_ID = 200  # leaves room for ":<token>" in the 255-character claimed_by column


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one pass (or a drain of several) did."""

    claimed: int = 0
    published: int = 0
    failed: bool = False
    """True if a publish failed (the rest of that claim was handed back)."""

    def __add__(self, other: PassResult) -> PassResult:
        return PassResult(
            self.claimed + other.claimed,
            self.published + other.published,
            self.failed or other.failed,
        )


_MESSAGE_PART = itemgetter(slice(1, None))
"""A mark-and-claim row without its leading ``marked`` column."""


_as_message: Callable[[Sequence[Any]], OutboxMessage] = partial(tuple.__new__, OutboxMessage)
"""A claimed row's eleven values as an :class:`OutboxMessage`, without a Python-level call.

``OutboxMessage._make`` does the same through a Python function and a length check; the claim's
columns are :data:`~sqla_outbox.queries.MESSAGE_FIELDS`, so the length is right by construction
(a unit test pins the two together), and a drain builds tens of thousands of these a second.
"""


@dataclass(frozen=True, slots=True)
class _Published:
    """A published run of a claim, ``first`` to ``last``: what one fenced mark retires.

    A loop keeps the one of a claim it published in full (``Relay._unmarked``) until the next
    claim carries its mark.
    """

    token: str
    first: OutboxMessage
    last: OutboxMessage
    count: int


def _from_driver_row(row: Any) -> OutboxMessage:
    """A message from a claim row as psycopg returns it (timestamps normalised to UTC)."""
    return OutboxMessage(
        row[0], row[1], row[2], row[3], row[4], row[5],
        as_utc(row[6]), as_utc(row[7]), row[8], row[9], row[10],
    )  # fmt: skip


def _slice(first: OutboxMessage, last: OutboxMessage, prefix: str = "") -> dict[str, Any]:
    """Bounds of a contiguous run of a claim, for the fenced mark and release statements."""
    return {
        f"{prefix}first_staged_at": first.staged_at,
        f"{prefix}first_id": first.id,
        f"{prefix}last_staged_at": last.staged_at,
        f"{prefix}last_id": last.id,
    }


def _describe(error: BaseException) -> str:
    """``Type: message``, or just ``Type`` for an error without one (``CancelledError()``)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _relay_engine(bind: object) -> Engine:
    # Refused before any connection, as ConfigurationError: a malformed URL, a database other
    # than PostgreSQL or SQLite, a driver that is not installed or is asyncio-only. An
    # AsyncEngine on psycopg 3 or aiosqlite becomes its synchronous twin's URL (preflight docs).
    bind = relay_bind(bind)
    if isinstance(bind, Engine):
        url = bind.url
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return bind
        # A claim on SQLite must hold the write lock from its first statement (BEGIN
        # IMMEDIATE); rather than add listeners to the caller's engine, use one of our own.
        bind = url
    return engine_from_url(bind, immediate=True, utc=True)


def _resolve_relay_id(relay_id: str | None) -> str:
    if relay_id is None:
        return f"relay-{uuid.uuid4()}"
    if not isinstance(relay_id, str) or not relay_id or len(relay_id) > _MAX_RELAY_ID:
        raise ConfigurationError(
            f"relay_id must be a non-empty string of at most {_MAX_RELAY_ID} characters, "
            f"got {relay_id!r}. Omit it for a unique relay-<uuid4>."
        )
    return relay_id


class Relay:
    """Publishes committed outbox rows, at least once, in claim order.

    Run several for throughput and availability: claims use ``SKIP LOCKED`` so relays never wait
    for each other, and fenced updates make a stalled relay harmless. See the module docs.

    :param bind: an ``Engine`` or a database URL.
    :param publisher: a callable taking one :class:`OutboxMessage`, or an object with
        ``publish(message)``; raising means "not published".
    :param batch_size: rows per claim.
    :param poll_interval: seconds between passes when there is nothing to do.
    :param claim_lease: seconds (or ``timedelta``) a claim stays this relay's; must be positive
        and finite, and the same for every relay of a deployment.
    :param relay_id: readable id, shown in ``claimed_by`` and logs; default ``relay-<uuid4>``.
    :param poll_only: do not LISTEN for commit notifications on PostgreSQL (needed behind
        PgBouncer in transaction pooling mode); rely on ``poll_interval`` alone.

    .. attribute:: max_backoff

        Seconds, the longest the loop waits before retrying after a database error or a failed
        publish (default :data:`MAX_BACKOFF`). It is part of :attr:`liveness_bound`; set it
        before :meth:`start`.
    """

    def __init__(
        self,
        bind: Engine | str | URL,
        publisher: PublisherLike,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        claim_lease: float | dt.timedelta = DEFAULT_CLAIM_LEASE,
        relay_id: str | None = None,
        poll_only: bool = False,
    ) -> None:
        self.batch_size = resolve_batch_size(batch_size)
        self.poll_interval = resolve_poll_interval(poll_interval)
        self.claim_lease = resolve_claim_lease(claim_lease)
        self.relay_id = _resolve_relay_id(relay_id)
        self.publisher = publisher
        self._publish = publish_function(publisher)
        self._publish_batch = batch_function(publisher)
        self.engine = _relay_engine(bind)
        self._owns_engine = self.engine is not bind
        self._dialect = self.engine.dialect.name
        self._claim = queries.claim_stmt(self._dialect)
        self._mark = queries.mark_published_stmt(self._dialect)
        self._release = queries.release_stmt()
        # PostgreSQL marks a claim inside the next claim's statement; SQLite, which allows no
        # UPDATE inside WITH, in the next claim's transaction.
        self._mark_and_claim = (
            queries.mark_and_claim_stmt() if self._dialect == "postgresql" else None
        )
        self._unmarked: _Published | None = None
        self._pass_lock = threading.Lock()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.max_backoff = MAX_BACKOFF
        self._liveness = Liveness()
        self.poll_only = poll_only or not can_listen(self.engine)
        self._listener = (
            None if self.poll_only else NotificationListener(self.engine, self.wake, self.relay_id)
        )
        # Single statements run in autocommit on PostgreSQL: a claim or a mark is one round trip
        # instead of BEGIN + statement + COMMIT, and is atomic on its own.
        self._autocommit = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT")
            if self._dialect == "postgresql"
            else None
        )
        self._held: Connection | None = None
        # On PostgreSQL through psycopg the pass's statements run pre-compiled, with psycopg's
        # own parameter adaptation and result values (uuid, jsonb -> dict, timestamptz): the
        # claim is the one statement whose rows are many, and SQLAlchemy's per-value processing
        # and per-statement cache lookups were a fifth of a drain's time.
        self._precompiled: dict[int, driver_sql.Precompiled] = {}
        if driver_sql.applies(self.engine.dialect, self.engine.get_execution_options()):
            for statement in (self._claim, self._mark_and_claim, self._mark, self._release):
                if statement is not None:
                    compiled = driver_sql.precompile(statement, self.engine.dialect)
                    self._precompiled[id(statement)] = compiled

    def __repr__(self) -> str:
        return f"<Relay {self.relay_id} on {hide_password(self.engine.url)}>"

    # -- one pass ---------------------------------------------------------------------------

    def tick(self) -> int:
        """Run one pass and return how many messages it published.

        A publisher failure is logged and recorded on the row, not raised; a database error is
        raised (the background loop retries it with backoff).
        """
        return self.run_pass().published

    def run_pass(self) -> PassResult:
        """One pass, with what it claimed and whether a publish failed."""
        try:
            return self._pass(interruptible=False)
        finally:
            with self._pass_lock:
                self._drop_held()  # only loops keep a connection between passes

    def drain(self) -> PassResult:
        """Run passes until nothing due is left, a publish fails, or :meth:`stop` is called.

        Returns the sum of what the passes did. A ``stop()`` from another thread (or a signal
        under ``run(once=True)``) ends the pass in flight after the message being published.
        """
        self._stopping.clear()
        return self._drain()

    def _drain(self) -> PassResult:
        total = PassResult()
        try:
            while not self._stopping.is_set():
                result = self._pass(interruptible=True, defer_mark=True)
                total += result
                if result.failed or not result.claimed:
                    break
        except BaseException:
            self._end_passes(quiet=True)  # the error that ended the drain is the one to raise
            raise
        self._end_passes(quiet=False)
        return total

    def _pass(self, *, interruptible: bool, defer_mark: bool = False) -> PassResult:
        """Claim, publish, settle. With ``defer_mark`` the caller claims again straight away,
        so a claim published in full leaves its mark to ride on that next claim."""
        with self._pass_lock:
            token = f"{self.relay_id}:{secrets.token_hex(8)}"
            messages = self._claim_rows(token)
            if not messages:
                return PassResult()
            published, failure = self._publish_in_order(messages, interruptible)
            if failure is not None and isinstance(failure[1], _ENDS_PROCESS):
                self._settle_and_raise(token, messages, published, failure[1])
            if defer_mark and failure is None and not self._stopping.is_set():
                self._unmarked = _Published(token, messages[0], messages[-1], published)
            else:
                self._settle(token, messages, published, failure)
            return PassResult(len(messages), published, failure is not None)

    def _settle_and_raise(
        self, token: str, messages: list[OutboxMessage], published: int, error: BaseException
    ) -> NoReturn:
        """Settle a pass a publisher ended with ``KeyboardInterrupt``/``SystemExit``, then raise it.

        Settled as a graceful stop: the message in flight is not to blame, so nothing is recorded
        on its row. A database error while settling is logged, not raised in its place: the
        request to stop is what the caller must see (the rows wait out the lease instead).
        """
        try:
            self._settle(token, messages, published, None)
        except Exception:
            log.exception("relay %s could not settle its claim before stopping", self.relay_id)
        raise error

    def _end_passes(self, *, quiet: bool) -> None:
        """Write a deferred mark, if any, and let go of the connection held between passes.

        ``quiet`` logs a failure to write the mark instead of raising it: the loop is ending
        over another error, or has no caller to raise to. Those rows were published and are
        published again once their lease lapses (at least once).
        """
        with self._pass_lock:
            try:
                self._settle_unmarked()
            except Exception as error:
                if not quiet:
                    raise
                unmarked = self._unmarked
                log_event(
                    log,
                    logging.WARNING,
                    "relay.mark_failed",
                    relay=self.relay_id,
                    claim=unmarked.token if unmarked else None,
                    rows=unmarked.count if unmarked else 0,
                    error=f"{type(error).__name__}: {error}".splitlines()[0],
                )
                self._unmarked = None
            finally:
                self._drop_held()

    def _settle_unmarked(self) -> None:
        unmarked = self._unmarked
        if unmarked is None:
            return
        with self._transaction(statements=1) as conn:
            marked = self._execute(conn, self._mark, self._mark_params(unmarked)).rowcount
        self._unmarked = None
        self._check_marked(unmarked, marked)

    def _mark_params(self, unmarked: _Published, prefix: str = "") -> dict[str, Any]:
        return self._params(
            **{f"{prefix}token": unmarked.token},
            **_slice(unmarked.first, unmarked.last, prefix),
        )

    def _check_marked(self, unmarked: _Published, marked: int) -> None:
        if marked != unmarked.count:
            self._log_lost_claim(unmarked.token, "mark", expected=unmarked.count, touched=marked)

    def _params(self, **params: Any) -> dict[str, Any]:
        if self._dialect != "postgresql":
            now = dt.datetime.now(dt.timezone.utc)
            params["now"] = now
            if "lease" in params:
                params["cutoff"] = now - params.pop("lease")
        return params

    def _claim_rows(self, token: str) -> list[OutboxMessage]:
        """Claim the next rows, writing the deferred mark of the previous claim with them."""
        params = self._params(limit=self.batch_size, lease=self.claim_lease, token=token)
        unmarked = self._unmarked
        if unmarked is None:
            with self._transaction(statements=1) as conn:
                _, messages = self._claimed(self._execute(conn, self._claim, params))
        elif self._mark_and_claim is not None:
            params.update(self._mark_params(unmarked, prefix="previous_"))
            with self._transaction(statements=1) as conn:
                result = self._execute(conn, self._mark_and_claim, params)
                marked, messages = self._claimed(result, marked_column=True)
            self._unmarked = None
            self._check_marked(unmarked, marked)
        else:
            with self._transaction(statements=2) as conn:
                marked = self._execute(conn, self._mark, self._mark_params(unmarked)).rowcount
                _, messages = self._claimed(self._execute(conn, self._claim, params))
            self._unmarked = None
            self._check_marked(unmarked, marked)
        if self._dialect != "postgresql":  # PostgreSQL's claim returns them in claim order
            # UUID.int compares natively; UUID objects compare through Python-level methods.
            messages.sort(key=lambda m: (m.staged_at, m.id.int))
        return messages

    def _claimed(
        self, result: CursorResult[Any], *, marked_column: bool = False
    ) -> tuple[int, list[OutboxMessage]]:
        """The messages of a claim's result, and its leading ``marked`` count if it has one."""
        rows: Sequence[Any]
        if self._precompiled:
            # psycopg's own tuples, read from the cursor: no SQLAlchemy Row per claimed row.
            try:
                rows = result.cursor.fetchall()
            finally:
                result.close()
        else:
            rows = cast("Sequence[Any]", result.all())  # Rows index like tuples
        marked = rows[0][0] if marked_column else 0
        if marked_column:
            rows = list(map(_MESSAGE_PART, rows)) if rows[0][1] is not None else []
        messages = list(map(_as_message, rows))
        if self._precompiled and messages and messages[0].staged_at.tzinfo is not dt.timezone.utc:
            # psycopg's values carry the session's zone; in a UTC session (use_utc_sessions)
            # they are timezone.utc already and the rows are the messages as they are.
            messages = [_from_driver_row(message) for message in messages]
        return marked, messages

    def _execute(
        self, conn: Connection, statement: Executable, params: dict[str, Any]
    ) -> CursorResult[Any]:
        precompiled = self._precompiled.get(id(statement))
        if precompiled is None:
            return conn.execute(statement, params)
        return conn.exec_driver_sql(precompiled.sql, precompiled.params(params))

    def _publish_in_order(
        self, messages: list[OutboxMessage], interruptible: bool
    ) -> tuple[int, tuple[OutboxMessage, BaseException] | None]:
        stopping = self._stopping if interruptible else threading.Event()
        if self._publish_batch is not None:
            if stopping.is_set():
                return 0, None
            try:
                self._publish_batch(messages)
            except BaseException as error:  # all of them: see _ENDS_PROCESS
                # Only a PublishError says how many went out; anything else counts as none, so
                # the worst case is a re-publish (at least once), never a lost message.
                confirmed = error.published if isinstance(error, PublishError) else 0
                confirmed = max(0, min(confirmed, len(messages) - 1))
                return confirmed, (messages[confirmed], error)
            return len(messages), None
        published = 0
        for message in messages:
            if stopping.is_set():
                break  # a graceful stop: mark what went out, hand back the rest
            try:
                self._publish(message)
            except BaseException as error:  # all of them: see _ENDS_PROCESS
                return published, (message, error)
            published += 1
        return published, None

    def _settle(
        self,
        token: str,
        messages: list[OutboxMessage],
        published: int,
        failure: tuple[OutboxMessage, BaseException] | None,
    ) -> None:
        remaining = len(messages) - published
        with self._transaction(statements=(published > 0) + (remaining > 0)) as conn:
            if published:
                done = _Published(token, messages[0], messages[published - 1], published)
                marked = self._execute(conn, self._mark, self._mark_params(done)).rowcount
                self._check_marked(done, marked)
            if remaining:
                failed, error = failure if failure else (None, None)
                params = {
                    "token": token,
                    "failed_id": failed.id if failed else None,
                    "error": _describe(error)[:2000] if error else None,
                    **_slice(messages[published], messages[-1]),
                }
                released = self._execute(conn, self._release, params).rowcount
                if released != remaining:
                    self._log_lost_claim(token, "release", expected=remaining, touched=released)
        if failure:
            message, error = failure
            log_event(
                log,
                logging.WARNING,
                "relay.publish_failed",
                relay=self.relay_id,
                job=message.job,
                id=message.id,
                published=published,
                remaining=remaining,
                error=_describe(error),
            )

    def _log_lost_claim(self, token: str, action: str, *, expected: int, touched: int) -> None:
        # Another relay reclaimed rows after this claim's lease lapsed. Its work stands; ours
        # is dropped. Rows we published but could not mark may be published twice.
        log_event(
            log,
            logging.WARNING,
            "relay.claim_lost",
            relay=self.relay_id,
            claim=token,
            action=action,
            expected=expected,
            touched=touched,
        )

    @contextmanager
    def _transaction(self, statements: int) -> Iterator[Connection]:
        """A connection for one pass step: autocommit for a single statement on PostgreSQL.

        Single statements reuse one connection held across passes (passes are serialised by
        ``_pass_lock``), saving a pool checkout and an isolation-level reset per statement. Any
        error drops it; the next step takes a fresh one from the pool.
        """
        with raise_if_missing_table(self.engine):
            if statements == 1 and self._autocommit is not None:
                if self._held is None:
                    self._held = self._autocommit.connect()
                try:
                    yield self._held
                except BaseException:
                    self._drop_held()
                    raise
                self._liveness.reached_database()
                return
            with self.engine.begin() as conn:
                yield conn
            self._liveness.reached_database()

    def _drop_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            try:
                held.close()
            except SQLAlchemyError:
                log.debug("closing a broken relay connection failed", exc_info=True)

    # -- inspection -------------------------------------------------------------------------

    def pending(self) -> int:
        """How many committed rows are not yet published."""
        with raise_if_missing_table(self.engine), self.engine.connect() as conn:
            return int(conn.execute(queries.pending_stmt()).scalar_one())

    def check(self) -> None:
        """Raise :class:`MissingTableError` unless the outbox table exists, and on PostgreSQL
        :class:`MissingPrivilegeError` unless this role may SELECT and UPDATE it; each says the
        fix. One statement; run it before :meth:`run` or :meth:`start` to fail fast.

        Also raises SQLAlchemy's ``OperationalError`` when the database cannot be reached.
        """
        with self.engine.connect() as conn:
            check_outbox_table(conn, RELAY_PRIVILEGES, needed_by="the relay")

    # -- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        """Run passes in a background thread until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=self.relay_id, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop and wait for the pass in flight to finish and write its marks.

        A pass in flight publishes nothing more once this is called: it marks what it already
        published and hands the rest of its claim back. Nothing is published after this returns.
        """
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is None:
            return  # a drain() or run() in another thread sees the flag and returns
        thread.join(timeout)
        if thread.is_alive():
            return  # the caller chose a timeout; the flag stays set
        self._thread = None
        self.close()

    def run(self, *, once: bool = False) -> PassResult:
        """Run passes in the foreground until SIGINT or SIGTERM, then finish the pass and return.

        With ``once=True``, :meth:`drain` instead: publish what is due, then return. Either way a
        signal stops the pass in flight after the message being published, marks what went out
        and hands the rest back. Returns the sum of what the passes did (``once`` only).
        """
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            self._stopping.clear()
            if once:
                return self._drain()
            self._loop()
            return PassResult()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.close()

    def wake(self) -> None:
        """Start the next pass now instead of after ``poll_interval``."""
        self._wake.set()

    def is_alive(self) -> bool:
        """True while the loop of :meth:`start` or :meth:`run` runs and has reached the database
        within the last :attr:`liveness_bound` seconds.

        The bound is ``claim_lease + max(poll_interval, max_backoff)``, 40 s by default: an idle
        loop reaches the database every ``poll_interval``, a pass publishes for at most
        ``claim_lease`` between two statements, a loop whose broker is down still claims and
        hands back every ``max_backoff`` at most, and the rest is room for slow statements, so a
        healthy relay never flaps. A loop in database-error backoff reaches nothing and turns
        false once the bound has passed since its last completed statement; true again after
        its next one. False before the first statement of a loop completes, after :meth:`stop`,
        after a ``KeyboardInterrupt``/``SystemExit`` ended the loop, and during
        ``run(once=True)``, which is a drain, not a loop. See :mod:`sqla_outbox.liveness`.

        Cheap and thread-safe (no I/O, no lock): what a ``/healthz`` endpoint calls.
        """
        return self._liveness.alive(self.liveness_bound)

    @property
    def liveness_bound(self) -> float:
        """Seconds without reaching the database after which :meth:`is_alive` turns false."""
        return liveness_bound(
            self.claim_lease.total_seconds(), self.poll_interval, self.max_backoff
        )

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log_event(log, logging.INFO, "relay.stopping", relay=self.relay_id, signal=signum)
        self._stopping.set()
        self._wake.set()

    def _loop(self) -> None:
        self._liveness.loop_started()
        try:
            if self._listener is not None:
                self._listener.start()
            subscribe(self)
            try:
                self._passes()
            except _ENDS_PROCESS as error:
                log_event(
                    log, logging.ERROR, "relay.aborted", relay=self.relay_id, error=_describe(error)
                )
                raise
            finally:
                unsubscribe(self)
                self._end_passes(quiet=True)
                if self._listener is not None:
                    self._listener.stop()
        finally:
            self._liveness.loop_ended()

    def _passes(self) -> None:
        log_event(
            log,
            logging.INFO,
            "relay.started",
            relay=self.relay_id,
            url=hide_password(self.engine.url),
            batch_size=self.batch_size,
            claim_lease=self.claim_lease.total_seconds(),
            wake="poll" if self.poll_only else "listen",
        )
        backoff = self.poll_interval
        while not self._stopping.is_set():
            result: PassResult | None = None
            try:
                result = self._pass(interruptible=True, defer_mark=True)
            except SQLAlchemyError as error:
                # Failover, connection reset, a lock timeout: log, wait, try again. Never end
                # the process over it; the rows are safe in the table.
                log_event(
                    log,
                    logging.ERROR,
                    "relay.database_error",
                    relay=self.relay_id,
                    retry_in=round(backoff, 3),
                    error=f"{type(error).__name__}: {error}".splitlines()[0],
                )
            except _ENDS_PROCESS:
                raise
            except BaseException as error:
                # A bug, or a BaseException from an event hook or a driver: the loop must not
                # end silently over it, leaving committed rows unpublished until a restart.
                self._log_unexpected(error, backoff)
            if result is None or result.failed:
                # A database error or a failed publish (a broker that is down): retry with
                # capped backoff rather than hammer it, and the log, every poll_interval.
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            backoff = self.poll_interval
            if result.claimed:
                # More may be due. A short claim does not mean an empty backlog: a claim leaves
                # out transactions another relay is still publishing the start of.
                continue
            self._wake.wait(self.poll_interval)
            self._wake.clear()
        log_event(log, logging.INFO, "relay.stopped", relay=self.relay_id)

    def _log_unexpected(self, error: BaseException, retry_in: float) -> None:
        # log_event's line, with the traceback: an unexpected error is a bug to be found.
        fields = {"relay": self.relay_id, "retry_in": round(retry_in, 3), "error": _describe(error)}
        log.error(
            "event=relay.unexpected_error %s",
            logfmt(fields),
            exc_info=error,
            extra={"outbox_event": "relay.unexpected_error", "outbox_fields": fields},
        )

    def close(self) -> None:
        """Close the publisher (if it has ``close()``) and the engine the relay created itself.

        :meth:`stop` and :meth:`run` call it. An engine passed in by the caller stays open: it is
        the caller's. Also called on leaving a ``with Relay(...) as relay:`` block.
        """
        self._end_passes(quiet=True)
        close = getattr(self.publisher, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("closing the publisher of relay %s failed", self.relay_id)
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._thread is not None:
            self.stop()
        else:
            self.close()
