"""The relay: claim committed rows, publish them in order, mark them published, fenced.

A pass is short statements with the publishing in between, outside any transaction:

1. **Claim** (one transaction, or one statement on PostgreSQL while nothing is crowded; see
   :mod:`sqla_outbox.plan` for the rule): lease up to ``batch_size`` due rows in claim order,
   stamping ``claimed_by`` with a fence token minted for *this claim* (``<relay_id>:<random>``)
   and ``claimed_at`` with the database's clock. A row is claimed only with every earlier
   unpublished row of its transaction and of its ``ordering_key``, so no relay can publish it
   ahead of them.
2. **Publish** in claim order (:mod:`sqla_outbox.publishing`). With ``order="key"`` (default) a
   message the broker refuses holds back only the later messages of its transaction and key;
   everything else in the claim is still published. With ``order="strict"`` the first failure
   ends the pass. A broker that cannot be reached is an outage: the pass ends, nobody is
   charged, and the loop backs off as a whole. While the pass publishes, its lease is renewed
   (:mod:`sqla_outbox.renewal`), so a slow broker never lets it lapse.
3. **Settle** (one transaction): mark what was published, charge each failed row an attempt
   (retried after a backoff, a dead letter after ``max_publish_attempts``,
   :mod:`sqla_outbox.retries`), and hand the rest back at once, uncharged.

A publisher fails by raising anything at all: a ``BaseException`` such as an
``asyncio.CancelledError`` escaping a client is a failed publish like any ``Exception``. Only
``KeyboardInterrupt`` and ``SystemExit`` are passed on, after the pass marks what went out and
hands the rest back. The loops of ``start()`` and ``run()`` outlive every other error as well,
logging it and retrying with capped backoff; :meth:`Relay.is_alive` says whether one is running
and reaching the database (:mod:`sqla_outbox.liveness`).

A loop working through a backlog (``drain()``, ``start()``, ``run()``) defers a pass's
write-back to the claim that follows at once: on PostgreSQL the mark of a claim published in
full travels in the claim's statement (:func:`~sqla_outbox.queries.fast_claim_stmt`), elsewhere
any write-back in the claim's transaction. A pass is then one round trip plus the publishing. A
write-back is never left waiting: before the loop sleeps, stops, or gives up after an error, it
is written on its own. The statements themselves run in a store (:mod:`sqla_outbox.stores`),
one per database and driver.

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
import time
import uuid
from dataclasses import dataclass
from types import FrameType
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from sqla_outbox import queries, sweeping, waiting
from sqla_outbox.claims import Claimed, WriteBack
from sqla_outbox.engines import hide_password
from sqla_outbox.errors import ArgumentValueError
from sqla_outbox.liveness import Liveness, liveness_bound
from sqla_outbox.logs import PassLog, describe_error, error_line, log_event
from sqla_outbox.message import OutboxMessage
from sqla_outbox.metrics import Registry, relay_metrics
from sqla_outbox.notify import subscribe, unsubscribe
from sqla_outbox.observers import PassObserver, PassReport
from sqla_outbox.overlap import ClaimAhead, wants_overlap
from sqla_outbox.preflight import RELAY_PRIVILEGES, check_outbox_table
from sqla_outbox.publishers import PublisherLike, batch_function, publish_function
from sqla_outbox.publishing import ENDS_PROCESS, PassOutcome, publish_claim
from sqla_outbox.renewal import Claim, LeaseRenewal
from sqla_outbox.retention import BackgroundPurge, resolve_older_than
from sqla_outbox.retries import (
    DEFAULT_MAX_PUBLISH_ATTEMPTS,
    DEFAULT_RETRY_BASE,
    DEFAULT_RETRY_MAX,
    resolve_retry_policy,
)
from sqla_outbox.schema_errors import raise_if_missing_table
from sqla_outbox.settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CLAIM_LEASE,
    DEFAULT_POLL_INTERVAL,
    resolve_batch_size,
    resolve_claim_lease,
    resolve_poll_interval,
)
from sqla_outbox.stores import open_store, relay_engine
from sqla_outbox.stores.operating import operations_for
from sqla_outbox.tracing import trace_publish, trace_publish_batch

__all__ = ["PassResult", "Relay"]

log = logging.getLogger("sqla_outbox.relay")

MAX_BACKOFF = 10.0
"""Seconds, the longest the loop waits before retrying after a database error or an outage."""

IDLE_MAX = 30.0
"""Seconds, the longest an idle relay whose LISTEN connection is up waits before it claims."""

_MAX_RELAY_ID = 200  # leaves room for ":<token>" in the 255-character claimed_by column


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one pass (or a drain of several) did."""

    claimed: int = 0
    published: int = 0
    failed: bool = False
    """True if a publish failed: a message the broker refused, or an outage."""
    outage: bool = False
    """True if the broker could not be reached (the rest of that claim was handed back)."""
    held: int = 0
    """Rows the claim left because another claim holds what they wait for (see
    :mod:`sqla_outbox.plan`): that claim is about to be published."""

    def __add__(self, other: PassResult) -> PassResult:
        return PassResult(
            self.claimed + other.claimed,
            self.published + other.published,
            self.failed or other.failed,
            self.outage or other.outage,
            self.held + other.held,
        )


def _resolve_relay_id(relay_id: str | None) -> str:
    if relay_id is None:
        return f"relay-{uuid.uuid4()}"
    if not isinstance(relay_id, str) or not relay_id or len(relay_id) > _MAX_RELAY_ID:
        raise ArgumentValueError(
            "relay_id",
            f"«relay_id» must be a non-empty string of at most {_MAX_RELAY_ID} characters, "
            f"got {relay_id!r}. Omit it for a unique relay-<uuid4>.",
        )
    return relay_id


def _resolve_order(order: object) -> str:
    if order not in queries.ORDERS:
        raise ArgumentValueError(
            "order",
            f"«order» must be 'key' or 'strict', got {order!r}. Pass «order='key'» (a message "
            "waits only for its transaction and ordering key) or «order='strict'» (nothing "
            "overtakes a failed message).",
        )
    return str(order)


class Relay:
    """Publishes committed outbox rows, at least once, in order.

    Run several for throughput and availability: claims use ``SKIP LOCKED`` so relays never wait
    for each other, and fenced updates make a stalled relay harmless. See the module docs.

    :param bind: an ``Engine`` or a database URL (an ``AsyncEngine`` on psycopg 3 or aiosqlite
        is replaced by a synchronous engine on the same URL).
    :param publisher: a callable taking one :class:`OutboxMessage`, or an object with
        ``publish(message)``; raising means "not published", raising
        :class:`~sqla_outbox.BrokerUnavailableError` means "the broker is down". Synchronous:
        an ``async def`` one is refused with ``TypeError``.
    :param batch_size: rows per claim.
    :param poll_interval: seconds between passes when there is nothing to do.
    :param claim_lease: seconds (or ``timedelta``) a claim stays this relay's unless renewed;
        must be positive and finite, and the same for every relay of a deployment.
    :param relay_id: readable id, shown in ``claimed_by`` and logs; default ``relay-<uuid4>``.
    :param poll_only: do not LISTEN for commit notifications on PostgreSQL (needed behind
        PgBouncer in transaction pooling mode); rely on ``poll_interval`` alone.
    :param order: ``"key"`` (default): an unpublished message holds back only the later
        messages of its own transaction and of its ``ordering_key``. ``"strict"``: the first
        failed message holds back every later one.
    :param max_publish_attempts: failed publishes after which a row becomes a dead letter;
        ``None`` retries for ever. It bounds the relay's attempts to hand a message to the
        broker; ``enqueue(max_attempts=...)`` is another thing, a field for the consumer (how
        often the job may run), which the relay only carries.
    :param retry_base: seconds; a row that failed ``n`` times waits ``min(retry_base * 2 **
        (n - 1), retry_max)`` before it is claimed again.
    :param retry_max: seconds, the longest retry backoff.
    :param registry: the Prometheus ``CollectorRegistry`` to record this relay's metrics in
        (:mod:`sqla_outbox.metrics`); ``None``: prometheus_client's default ``REGISTRY``, if
        prometheus_client is installed (``pip install "sqla-outbox[prometheus]"``), else none.
        Relays sharing a registry share its metrics.
    :param retain_published: a ``timedelta``: while it has nothing to publish, the relay deletes
        the rows published longer ago than that, a bounded round at a time, at most once a
        minute unless it has more to catch up on (``relay.retention``, a
        :class:`~sqla_outbox.retention.BackgroundPurge`; logged as ``relay.purged``). Needs
        ``DELETE`` on the table. ``None`` (default): published rows are kept; purge them with
        :func:`~sqla_outbox.purge` or ``sqla-outbox purge``.
    :param overlap: claim the next rows while a pass publishes (:mod:`sqla_outbox.overlap`):
        ``None`` (default) does it for publishers that declare ``overlap = True`` (the bundled
        brokers where it was measured to pay); ``True``/``False`` decide for any publisher.
        PostgreSQL only: on SQLite and MySQL a relay claims between passes whatever this says.
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
        order: str = "key",
        max_publish_attempts: int | None = DEFAULT_MAX_PUBLISH_ATTEMPTS,
        retry_base: float = DEFAULT_RETRY_BASE,
        retry_max: float = DEFAULT_RETRY_MAX,
        registry: Registry | None = None,
        retain_published: dt.timedelta | None = None,
        overlap: bool | None = None,
    ) -> None:
        self.batch_size = resolve_batch_size(batch_size)
        self.poll_interval = resolve_poll_interval(poll_interval)
        self.claim_lease = resolve_claim_lease(claim_lease)
        self.relay_id = _resolve_relay_id(relay_id)
        self.order = _resolve_order(order)
        self.retry = resolve_retry_policy(max_publish_attempts, retry_base, retry_max)
        if retain_published is not None:
            retain_published = resolve_older_than(retain_published, argument="retain_published")
        self.publisher = publisher
        self._publish = trace_publish(publish_function(publisher), publisher)
        self._publish_batch = trace_publish_batch(batch_function(publisher), publisher)
        self.engine = relay_engine(bind)
        self._owns_engine = self.engine is not bind
        self.retention = (
            None
            if retain_published is None
            else BackgroundPurge(self.engine, retain_published, relay_id=self.relay_id)
        )
        self._liveness = Liveness()
        self._statements = open_store(
            self.engine,
            relay_id=self.relay_id,
            order=self.order,
            batch_size=self.batch_size,
            claim_lease=self.claim_lease,
            retry=self.retry,
            liveness=self._liveness,
        )
        self._renewal = LeaseRenewal(
            self._statements.renew, self.claim_lease.total_seconds() / 3, self.relay_id
        )
        self._carried: WriteBack | None = None
        self._ahead = (
            ClaimAhead(self._statements, self.relay_id)
            if wants_overlap(publisher, overlap) and self._statements.can_claim_ahead
            else None
        )
        self._pass_lock = threading.Lock()
        """Held by whatever uses the store's connection kept between passes (a pass, the end of
        passes, a sweep, the idle plan): a ``tick()`` from another thread while the loop runs
        must not share that connection with the loop mid-statement."""
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._sweeps = sweeping.SweepClock()
        self._observers: list[PassObserver] = []
        if log.isEnabledFor(logging.DEBUG):
            self.observe(PassLog(log))
        metrics = relay_metrics(self, registry)  # imports prometheus_client only if installed
        if metrics is not None:
            self.observe(metrics)
        self._table_checked = False  # check() passed: start() and run() need not repeat it
        self.max_backoff = MAX_BACKOFF
        """Seconds, the longest the loop waits before retrying after a database error or a broker
        outage (default :data:`MAX_BACKOFF`). It is part of :attr:`liveness_bound`; set it before
        :meth:`start`."""
        self._listener = None if poll_only else self._statements.listener(self.wake, self.relay_id)
        self.poll_only = self._listener is None

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
                self._statements.drop_connection()  # only loops keep one between passes

    def drain(self) -> PassResult:
        """Run passes until nothing claimable is left, the broker is down, or :meth:`stop`.

        A message that fails is charged and retried later (it is not claimable during its
        backoff), so a drain goes on past it; ``failed`` in the result says one did. Returns the
        sum of what the passes did. A ``stop()`` from another thread (or a signal under
        ``run(once=True)``) ends the pass in flight after the message being published.
        """
        self._stopping.clear()
        return self._drain()

    def _drain(self) -> PassResult:
        total = PassResult()
        try:
            while not self._stopping.is_set():
                result = self._pass(interruptible=True, defer_mark=True)
                total += result
                if result.outage:
                    break
                if result.claimed:
                    self._sweep_while_busy()
                elif not self._sweep():
                    break
        except BaseException:
            self._end_passes(quiet=True)  # the error that ended the drain is the one to raise
            raise
        self._end_passes(quiet=False)
        return total

    def _pass(self, *, interruptible: bool, defer_mark: bool = False) -> PassResult:
        """Claim, publish, settle. With ``defer_mark`` the caller claims again straight away,
        so a claim published in full leaves its mark to ride on that next claim, and a relay
        that overlaps (:mod:`sqla_outbox.overlap`) sends that claim while this one publishes."""
        with self._pass_lock:
            ahead = self._ahead if defer_mark else None
            claimed = ahead.take(self._renewal.interval) if ahead is not None else None
            if claimed is None:
                claimed = self._claim()
                if not claimed.messages:
                    return PassResult(held=claimed.held)
            carried: WriteBack | None = None
            if ahead is not None and not self._stopping.is_set():
                carried, self._carried = self._carried, None
                ahead.start(self._new_token(), carried, in_flight=claimed.token)
            started = time.perf_counter()
            outcome = self._publish_claim(claimed, interruptible)
            ahead_error = self._claimed_ahead(carried)
            write_back, dead = self._statements.write_back(claimed, outcome)
            if (
                defer_mark
                and ahead_error is None
                and not self._stopping.is_set()
                and outcome.outage is None
                and outcome.stop is None
                # A claim taken ahead counted this claim's rows as published: only a pass that
                # published them all may leave its write-back to the next claim.
                and (outcome.complete or ahead is None)
                and self._statements.can_carry(write_back)
            ):
                self._carried = write_back
            else:
                self._write(write_back, outcome)
                if ahead is not None:
                    # A failure, an outage or a stop: what was claimed ahead goes back untried.
                    ahead.hand_back()
            if self._observers:
                self._report(claimed, outcome, dead, time.perf_counter() - started)
            if ahead_error is not None:
                raise ahead_error
            if outcome.outage is not None:
                log_event(
                    log,
                    logging.WARNING,
                    "relay.broker_unavailable",
                    relay=self.relay_id,
                    published=len(outcome.published),
                    handed_back=len(outcome.handed_back),
                    error=describe_error(outcome.outage),
                )
            if outcome.stop is not None:
                raise outcome.stop
            result = PassResult(
                len(claimed.messages),
                len(outcome.published),
                bool(outcome.failed) or outcome.outage is not None,
                outcome.outage is not None,
            )
            # A failure's traceback holds this frame (through its frames' f_back): the frame
            # must not hold the failure in turn (see PassOutcome.drop_frames).
            outcome.drop_frames()
            del outcome
            return result

    def _claim(self) -> Claimed:
        """The pass's claim, with the last pass's write-back riding on it."""
        carried, self._carried = self._carried, None
        try:
            return self._statements.claim(self._new_token(), carried)
        except BaseException:
            # The write-back went down with the claim carrying it: keep it for the next attempt
            # (or for _end_passes). Writing it twice is harmless: it is fenced.
            self._carried = carried
            raise

    def _claimed_ahead(self, carried: WriteBack | None) -> BaseException | None:
        """Wait for the claim sent ahead and keep it for the next pass; what it raised, if it
        failed (the mark it carried is then owed again)."""
        ahead = self._ahead
        if ahead is None or not ahead.started:
            return None
        try:
            ahead.keep(ahead.wait())
        except BaseException as error:
            if not ahead.marked:
                self._carried = carried
            return error
        return None

    def _new_token(self) -> str:
        return f"{self.relay_id}:{secrets.token_hex(8)}"

    def _publish_claim(self, claimed: Claimed, interruptible: bool) -> PassOutcome:
        """Publish one claim in order while its lease is renewed."""
        stopping = self._stopping if interruptible else threading.Event()
        claim = Claim(claimed.token, [m.id for m in claimed.messages])
        lost = claim.lost
        self._renewal.begin(claim, since=claimed.taken_at)
        try:
            return publish_claim(
                claimed.messages,
                self._publish,
                self._publish_batch,
                strict=self.order == "strict",
                should_stop=lambda: stopping.is_set() or lost.is_set(),
            )
        finally:
            self._renewal.end()

    def _write(self, write_back: WriteBack, outcome: PassOutcome) -> None:
        """Write a pass back now; a pass a publisher ended with ``KeyboardInterrupt``/
        ``SystemExit`` logs a database error here instead of raising it, so the stop is what the
        caller sees (its rows then wait out the lease)."""
        try:
            self._statements.write(write_back)
        except Exception:
            if outcome.stop is None:
                raise
            log_event(log, logging.ERROR, "relay.settle_failed", exc_info=True, relay=self.relay_id)

    def observe(self, observer: PassObserver) -> None:
        """Have ``observer.pass_done`` called after every pass that claims something (see
        :mod:`sqla_outbox.observers`); metrics and debug logs subscribe this way."""
        self._observers.append(observer)

    def _report(
        self, claimed: Claimed, outcome: PassOutcome, dead: list[OutboxMessage], seconds: float
    ) -> None:
        report = PassReport(self.relay_id, tuple(claimed.messages), outcome, tuple(dead), seconds)
        for observer in self._observers:
            try:
                observer.pass_done(report)
            except Exception:
                log_event(
                    log, logging.ERROR, "relay.observer_failed", exc_info=True, relay=self.relay_id
                )

    def _end_passes(self, *, quiet: bool) -> None:
        """Write a deferred write-back, if any, and let go of the connection held between passes.

        ``quiet`` logs a failure to write it instead of raising it: the loop is ending over
        another error, or has no caller to raise to. Its published rows are published again
        once their lease lapses (at least once), the rest is claimed again.
        """
        with self._pass_lock:
            carried, self._carried = self._carried, None
            try:
                if carried is not None:
                    self._statements.write(carried)
                if self._ahead is not None:
                    self._ahead.hand_back()
            except Exception as error:
                if not quiet:
                    raise
                log_event(
                    log,
                    logging.WARNING,
                    "relay.mark_failed",
                    relay=self.relay_id,
                    claim=carried.token if carried else None,
                    rows=len(carried.ids) if carried else 0,
                    error=error_line(error),
                )
            finally:
                self._statements.drop_connection()

    def _idle_wait(self) -> float:
        """Seconds the idle loop may wait for a wake-up before it claims again (0: claim now).

        Polling: ``poll_interval``, with a sweep for parked rows every
        :data:`~sqla_outbox.sweeping.SWEEP_INTERVAL`.
        While LISTEN is up, every commit wakes the relay, so the loop only has to come back for
        what no commit announces: a ``run_at`` or a retry backoff coming due, a claim's lease
        lapsing, parked rows to sweep. One statement finds the earliest of those, and the loop
        sleeps until then (at most :data:`IDLE_MAX`, and half the liveness bound), at least
        ``poll_interval`` only when what it found is due already.
        """
        listener = self._listener
        if listener is None or not listener.listening.is_set():
            if self._sweeps.due(idle=True) and self._sweep():
                return 0.0
            return self.poll_interval
        with self._pass_lock:  # on the held connection, as a pass is
            due_in, parked = self._statements.idle_plan()
        # Rows due so late that the sweep would park them ask for one as parked rows do.
        parked = parked or (due_in is not None and due_in > waiting.PARK_AHEAD.total_seconds())
        if parked and self._sweeps.due(idle=True) and self._sweep():
            return 0.0
        wait = min(IDLE_MAX, self.liveness_bound / 2)
        if due_in is not None:
            wait = min(wait, due_in)
        if parked:
            wait = min(wait, sweeping.SWEEP_INTERVAL)
        if due_in:
            # Something comes due at a known instant (a backoff ending, a scheduled row): wake
            # then, even sooner than poll_interval, or a retry waits a poll it need not.
            return wait
        # Due now yet the claim just left it (held back, or another relay's): poll, not spin.
        return max(wait, self.poll_interval)

    def _sweep_while_busy(self) -> None:
        """Sweep between two passes that claimed, once due (see :mod:`sqla_outbox.sweeping`)."""
        if self._sweeps.due():
            self._sweep()

    def _sweep(self) -> bool:
        """Unpark rows whose holder went without unparking them, wake and park rows by when
        they are due (:mod:`sqla_outbox.waiting`); whether any row is claimable that was not."""
        with self._pass_lock:
            self._sweeps.swept()
            # A write-back waiting for the next claim is written first: its rows' lease is not
            # renewed meanwhile, and a sweep may take a while.
            carried, self._carried = self._carried, None
            if carried is not None:
                try:
                    self._statements.write(carried)
                except BaseException:
                    self._carried = carried
                    raise
            swept = self._statements.sweep()
        for event, rows in (
            ("relay.unparked", swept.unparked),
            ("relay.woken", swept.woken),
            ("relay.parked_until_due", swept.parked),
        ):
            if rows:
                log_event(log, logging.INFO, event, relay=self.relay_id, rows=rows)
        return swept.freed > 0

    # -- inspection -------------------------------------------------------------------------

    def pending(self) -> int:
        """How many committed rows are not yet published (dead letters included)."""
        with raise_if_missing_table(self.engine), self.engine.connect() as conn:
            return operations_for(self.engine.dialect.name).pending(conn)

    def check(self) -> None:
        """Raise :class:`MissingTableError` unless the outbox table exists, and on PostgreSQL
        :class:`MissingPrivilegeError` unless this role may SELECT and UPDATE it (and DELETE
        from it with ``retain_published``); each says the fix. One statement; run it before
        :meth:`run` or :meth:`start` to fail fast.

        Also raises SQLAlchemy's ``OperationalError`` when the database cannot be reached.
        """
        privileges = RELAY_PRIVILEGES if self.retention is None else (*RELAY_PRIVILEGES, "DELETE")
        needed_by = "the relay" if self.retention is None else "the relay with retain_published"
        with self.engine.connect() as conn:
            check_outbox_table(conn, privileges, needed_by=needed_by)
        self._table_checked = True

    # -- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        """Run passes in a background thread until :meth:`stop`.

        Raises :class:`MissingTableError`, :class:`SchemaVersionError` or
        :class:`MissingPrivilegeError` first when the table cannot serve this relay: a loop
        would only log the same error for ever. A database that cannot be reached now is left
        to the loop, which retries it with backoff.
        """
        if self._thread is not None and self._thread.is_alive():
            return
        self._refuse_unusable_table()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=self.relay_id, daemon=True)
        self._thread.start()

    def _refuse_unusable_table(self) -> None:
        """:meth:`check`, unless it has passed already (the command line checks before it
        runs), except that a database error (unreachable, failing over) is left to the loop,
        which logs it and retries."""
        if self._table_checked:
            return
        try:
            self.check()
        except SQLAlchemyError:
            log.debug("the start-up check could not run; the loop retries", exc_info=True)

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
            self._refuse_unusable_table()
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
            except ENDS_PROCESS as error:
                log_event(
                    log,
                    logging.ERROR,
                    "relay.aborted",
                    relay=self.relay_id,
                    error=describe_error(error),
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
                if result.claimed:
                    self._sweep_while_busy()
            except SQLAlchemyError as error:
                # Failover, connection reset, a lock timeout: log, wait, try again. Never end
                # the process over it; the rows are safe in the table.
                log_event(
                    log,
                    logging.ERROR,
                    "relay.database_error",
                    relay=self.relay_id,
                    retry_in=round(backoff, 3),
                    error=error_line(error),
                )
            except ENDS_PROCESS:
                raise
            except BaseException as error:
                # A bug, or a BaseException from an event hook or a driver: the loop must not
                # end silently over it, leaving committed rows unpublished until a restart.
                self._log_unexpected(error, backoff)
            if result is None or result.outage:
                # A database error or a broker that is down: retry with capped backoff rather
                # than hammer it, and the log, every poll_interval. A message the broker refused
                # is no reason to wait: it is charged, and everything else flows.
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            backoff = self.poll_interval
            if result.claimed:
                # More may be due. A short claim does not mean an empty backlog: a claim leaves
                # out transactions another relay is still publishing the start of.
                continue
            if result.held:
                # Rows wait for another relay's claim, whose mark notifies nobody: look again
                # after a poll, not after the idle plan's wait (sweeping when due, as a relay
                # that never goes idle must).
                self._sweep_while_busy()
                self._wake.wait(self.poll_interval)
                self._wake.clear()
                continue
            if self.retention is not None and self.retention.run_if_due(self._stopping.is_set):
                continue  # more history to purge: claim first, then the next round
            try:
                wait = self._idle_wait()
            except SQLAlchemyError:
                log.debug("planning the idle wait failed; polling instead", exc_info=True)
                wait = self.poll_interval
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
        log_event(log, logging.INFO, "relay.stopped", relay=self.relay_id)

    def _log_unexpected(self, error: BaseException, retry_in: float) -> None:
        # With the traceback: an unexpected error is a bug to be found.
        log_event(
            log,
            logging.ERROR,
            "relay.unexpected_error",
            exc_info=error,
            relay=self.relay_id,
            retry_in=round(retry_in, 3),
            error=describe_error(error),
        )

    def close(self) -> None:
        """Close the publisher (if it has ``close()``) and the engine the relay created itself.

        :meth:`stop` and :meth:`run` call it. An engine passed in by the caller stays open: it is
        the caller's. Also called on leaving a ``with Relay(...) as relay:`` block.
        """
        self._end_passes(quiet=True)
        if self._ahead is not None:
            self._ahead.close()
        self._renewal.close()
        close = getattr(self.publisher, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log_event(
                    log, logging.ERROR, "relay.close_failed", exc_info=True, relay=self.relay_id
                )
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._thread is not None:
            self.stop()
        else:
            self.close()
