"""Soak: concurrent writers and relays on hot ordering keys, then every message accounted for.

``.venv/bin/python -m benchmarks.soak --url URL [--seconds 20] [--drain 60] [--fail 0.02]
[--keyed 0.7] [--keys-per-writer 4] [--writers 4] [--relays 2] [--kill] [--log PATH] [--keep]``

Not a benchmark and not part of the pytest suite: a check of the relay's promises under load,
usable from CI (it exits non-zero when one is broken). For ``--seconds``:

* ``--writers`` threads each commit transactions of 1 to 8 messages through ``outbox.enqueue``,
  pausing up to 10 ms between them. A message has an ordering key with probability ``--keyed``,
  one of ``--keys-per-writer`` keys of its writer (4 writers x 4 keys: 16 hot keys); 15% of the
  messages are staged in a savepoint that is rolled back, and 10% of the transactions are
  rolled back whole.
* ``--relays`` relays run their background loops (``start()``) with ``batch_size=50,
  retry_base=0.05, retry_max=0.5, claim_lease=2``. Their publisher refuses the first attempt of
  a fixed share (``--fail``) of the messages, chosen by a hash of the message's name.
* With ``--kill`` (PostgreSQL only) every connection of the relays' engine, recognised by its
  ``application_name``, is terminated every 0.3 s (``pg_terminate_backend``) while the writers
  write; the writers' connections are left alone.

Then the writers stop, and the soak waits up to ``--drain`` seconds for every committed message
to be published, printing progress every 5 s (committed, published, pending and parked rows),
stops the relays and counts:

* **lost**: committed, never published, and no longer pending in the outbox;
* **not drained**: committed, never published, still pending when ``--drain`` ran out;
* **duplicated**: publishes beyond the first of a message. At-least-once allows them when a
  relay loses its connection between publishing a pass and marking it, so ``--kill`` runs show
  some; the soak counts them and fails all the same;
* **phantom**: published messages whose transaction or savepoint was rolled back;
* **order violations**: pairs of messages published in the reverse of their order within a
  transaction, or within an ordering key (a writer's transactions commit one after the other,
  so its transaction numbers are the commit order of its keys); the first publish counts.

The summary gives the time from the writers' stop to the last message published, and the exit
status is 1 if any count above is not zero (2 for a bad option). A writer's transaction that
failed in its commit is counted apart (its outcome is unknown) and checked for nothing.

``--url`` names the server and the database: ``postgresql+psycopg://postgres@127.0.0.1:5432/soak``
(default) or ``mysql+pymysql://root@127.0.0.1:3306/soak``. **The database is dropped and
created afresh**, and dropped at the end unless ``--keep``. The relays' log goes to ``--log
PATH`` (INFO and up, ``--log-level`` to change); without it, it is discarded and only its
warnings and errors are counted by event in the summary.

The failing messages are chosen per message, by a hash of the name, not drawn per attempt, so
every run refuses the same messages once each.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import logging
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import sqla_outbox as outbox
from benchmarks.harness import OUTBOX_TABLE

__all__ = ["Ledger", "Outcome", "main"]

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/soak"
RELAY_APPLICATION = "sqla-outbox-soak-relay"
"""The ``application_name`` of the relays' connections: what ``--kill`` terminates."""

MAX_PER_TRANSACTION = 8
SAVEPOINT_SHARE = 0.15
"""Messages staged in a savepoint that is then rolled back."""
ROLLBACK_SHARE = 0.1
"""Transactions rolled back whole."""
WRITER_PAUSE = 0.01
"""Seconds, the longest pause of a writer between two transactions."""

BATCH_SIZE = 50
RETRY_BASE = 0.05
RETRY_MAX = 0.5
CLAIM_LEASE = 2.0

KILL_EVERY = 0.3
REPORT_EVERY = 5.0
JOB = "soak"

MYSQL_BACKENDS = ("mysql", "mariadb")


class Message(NamedTuple):
    """A committed message: its transaction, the transaction's number in its writer's order,
    its place in the transaction, its ordering key."""

    transaction: str
    number: int
    place: int
    key: str | None


# --- what happened ----------------------------------------------------------------------------


@dataclass
class Ledger:
    """What the writers committed and rolled back, and what the publisher received.

    Message names are ``w<writer>-<transaction>-<place>``. Everything is guarded by ``lock``.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    committed: dict[str, Message] = field(default_factory=dict)
    rolled_back: set[str] = field(default_factory=set)
    """Messages of rolled-back transactions and savepoints: publishing one is a phantom."""
    uncertain: set[str] = field(default_factory=set)
    """Messages of transactions whose commit raised: committed or not, nobody knows."""
    writer_errors: Counter[str] = field(default_factory=Counter)
    published: list[str] = field(default_factory=list)
    """Every successful publish, in order, duplicates included."""
    distinct: set[str] = field(default_factory=set)
    outstanding: set[str] = field(default_factory=set)
    """Committed messages not published yet: the drain is over when it is empty."""
    refused: set[str] = field(default_factory=set)

    def transaction_done(
        self,
        committed: Sequence[tuple[str, Message]],
        rolled_back: Sequence[str],
        uncertain: Sequence[str] = (),
    ) -> None:
        """Record what became of a transaction's messages once it has ended."""
        with self.lock:
            self.rolled_back.update(rolled_back)
            self.uncertain.update(uncertain)
            for name, message in committed:
                self.committed[name] = message
                if name not in self.distinct:
                    self.outstanding.add(name)

    def writer_failed(self, error: BaseException) -> None:
        with self.lock:
            self.writer_errors[type(error).__name__] += 1

    def record_publish(self, name: str) -> None:
        """Called by the publisher, under ``lock``."""
        self.published.append(name)
        self.distinct.add(name)
        self.outstanding.discard(name)

    def counts(self) -> tuple[int, int, int]:
        """Committed, distinct published, still outstanding."""
        with self.lock:
            return len(self.committed), len(self.distinct), len(self.outstanding)

    def drained(self) -> bool:
        with self.lock:
            return not self.outstanding


def fails_once(name: str, share: float) -> bool:
    """Whether the message ``name`` is among the ``share`` whose first publish fails (fixed)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < share * 2**64


class TransientError(Exception):
    """What the publisher raises on the first attempt of a failing message."""


class Publisher:
    """Records every publish in the ledger; refuses the first attempt of a ``share`` of them."""

    def __init__(self, ledger: Ledger, share: float) -> None:
        self.ledger = ledger
        self.share = share

    def __call__(self, message: outbox.OutboxMessage) -> None:
        name = str(message.input["mid"])
        with self.ledger.lock:
            if name not in self.ledger.refused and fails_once(name, self.share):
                self.ledger.refused.add(name)
                raise TransientError(f"soak: {name} refused once")
            self.ledger.record_publish(name)


# --- the threads ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What the writers write."""

    keyed: float
    keys_per_writer: int


def write(number: int, app: sa.Engine, shape: Shape, ledger: Ledger, stop: threading.Event) -> None:
    """One writer: transactions until ``stop``, with savepoints and transactions rolled back.

    The draws come from ``random.Random(number)``, so a writer stages the same transactions in
    every run (how the threads interleave differs from run to run). An error
    is counted and the writer goes on: before the commit it means nothing was committed; in the
    commit, the transaction's messages are set aside as :attr:`Ledger.uncertain`.
    """
    rnd = random.Random(number)
    for count in itertools.count():
        if stop.is_set():
            return
        transaction = f"w{number}-{count}"
        kept: list[tuple[str, Message]] = []
        doomed: list[str] = []
        uncertain: list[str] = []
        committing = False
        try:
            with Session(app) as session:
                for place in range(rnd.randint(1, MAX_PER_TRANSACTION)):
                    key = None
                    if rnd.random() < shape.keyed:
                        key = f"k{number}-{rnd.randint(0, shape.keys_per_writer - 1)}"
                    name = f"{transaction}-{place}"
                    if rnd.random() < SAVEPOINT_SHARE:
                        savepoint = session.begin_nested()
                        outbox.enqueue(session, JOB, {"mid": name, "sp": 1}, ordering_key=key)
                        savepoint.rollback()
                        doomed.append(name)
                        continue
                    outbox.enqueue(session, JOB, {"mid": name}, ordering_key=key)
                    kept.append((name, Message(transaction, count, place, key)))
                if rnd.random() < ROLLBACK_SHARE:
                    session.rollback()
                    doomed += [name for name, _ in kept]
                    kept = []
                else:
                    committing = True
                    session.commit()
        except Exception as error:  # the summary counts writers' errors; the soak goes on
            ledger.writer_failed(error)
            (uncertain if committing else doomed).extend(name for name, _ in kept)
            kept = []
        ledger.transaction_done(kept, doomed, uncertain)
        time.sleep(rnd.random() * WRITER_PAUSE)


def kill_relays(admin: sa.Engine, database: str, stop: threading.Event, kills: list[int]) -> None:
    """Terminate the relays' PostgreSQL connections every :data:`KILL_EVERY` s until ``stop``."""
    terminate = sa.text(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = :application AND datname = :database"
    )
    try:
        with admin.connect() as conn:
            while not stop.wait(KILL_EVERY):
                killed = conn.execute(
                    terminate, {"application": RELAY_APPLICATION, "database": database}
                ).scalar_one()
                kills.append(int(killed))
    except sa.exc.SQLAlchemyError as error:
        print(f"soak: the kill thread stopped: {error}", file=sys.stderr, flush=True)


# --- the server -------------------------------------------------------------------------------


def is_postgresql(url: URL) -> bool:
    return url.get_backend_name() == "postgresql"


def _admin(url: URL, *statements: str) -> None:
    """Run ``statements`` in autocommit outside ``url``'s database (CREATE/DROP DATABASE)."""
    elsewhere = url.set(database="postgres" if is_postgresql(url) else "information_schema")
    engine = sa.create_engine(elsewhere, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(sa.text(statement))
    finally:
        engine.dispose()


def recreate_database(url: URL) -> None:
    """Drop ``url``'s database if it exists and create it empty."""
    if is_postgresql(url):
        _admin(
            url,
            f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)',
            f'CREATE DATABASE "{url.database}"',
        )
    else:
        _admin(
            url,
            f"DROP DATABASE IF EXISTS `{url.database}`",
            f"CREATE DATABASE `{url.database}` CHARACTER SET utf8mb4",
        )


def drop_database(url: URL) -> None:
    if is_postgresql(url):
        _admin(url, f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')
    else:
        _admin(url, f"DROP DATABASE IF EXISTS `{url.database}`")


class OutboxState(NamedTuple):
    """The outbox's unpublished rows, as the database has them."""

    pending: int
    parked: int
    claimed: int
    dead: int


def outbox_state(engine: sa.Engine) -> OutboxState:
    table = OUTBOX_TABLE
    query = sa.select(
        sa.func.count(),
        sa.func.count(sa.case((table.c.parked, 1))),
        sa.func.count(table.c.claimed_by),
        sa.func.count(table.c.dead_at),
    ).where(table.c.published_at.is_(None))
    with engine.connect() as conn:
        pending, parked, claimed, dead = conn.execute(query).one()
    return OutboxState(int(pending), int(parked), int(claimed), int(dead))


def pending_names(engine: sa.Engine) -> set[str]:
    """The names of the messages still unpublished in the outbox."""
    table = OUTBOX_TABLE
    with engine.connect() as conn:
        inputs = conn.execute(sa.select(table.c.input).where(table.c.published_at.is_(None)))
        return {str(row[0]["mid"]) for row in inputs}


# --- the relays' log ----------------------------------------------------------------------------


class EventCounter(logging.Handler):
    """Counts the relays' warnings and errors by event name (``relay.publish_failed``, ...)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "outbox_event", None) or f"{record.name}: {record.levelname}"
        self.counts[str(event)] += 1


def route_relay_logs(path: str | None, level: int) -> EventCounter:
    """Keep the ``sqla_outbox`` log off the console: to ``path`` from ``level`` up, if given;
    its warnings and errors counted either way."""
    logger = logging.getLogger("sqla_outbox")
    logger.propagate = False
    counter = EventCounter()
    logger.addHandler(counter)
    logger.setLevel(logging.WARNING)
    if path:
        handler = logging.FileHandler(path, mode="w", encoding="utf-8")
        handler.setLevel(level)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s %(message)s")
        )
        logger.addHandler(handler)
        logger.setLevel(min(level, logging.WARNING))
    return counter


# --- the verdict --------------------------------------------------------------------------------


def order_violations(committed: dict[str, Message], published: Sequence[str]) -> tuple[int, int]:
    """Adjacent pairs published in the reverse of their order, per transaction and per key.

    A message's position is its first publish. Within a key, the order is the writer's commit
    order: (transaction number, place).
    """
    first: dict[str, int] = {}
    for position, name in enumerate(published):
        first.setdefault(name, position)
    by_transaction: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
    by_key: defaultdict[str, list[tuple[tuple[int, int], int]]] = defaultdict(list)
    for name, message in committed.items():
        at = first.get(name)
        if at is None:
            continue
        by_transaction[message.transaction].append((message.place, at))
        if message.key is not None:
            by_key[message.key].append(((message.number, message.place), at))
    transaction_order = sum(
        later[1] < earlier[1]
        for rows in by_transaction.values()
        for earlier, later in itertools.pairwise(sorted(rows))
    )
    key_order = sum(
        later[1] < earlier[1]
        for rows in by_key.values()
        for earlier, later in itertools.pairwise(sorted(rows))
    )
    return transaction_order, key_order


@dataclass(frozen=True)
class Outcome:
    """The counts the soak judges by."""

    committed: int
    published: int
    """Distinct messages published."""
    publishes: int
    """Successful publishes, duplicates included."""
    not_drained: int
    lost: int
    duplicated: int
    phantom: int
    transaction_order: int
    key_order: int
    drained_in: float | None
    """Seconds from the writers' stop until every committed message was published."""

    @classmethod
    def count(cls, ledger: Ledger, still_pending: set[str], drained_in: float | None) -> Outcome:
        with ledger.lock:
            publishes = Counter(ledger.published)
            unpublished = set(ledger.committed) - publishes.keys()
            transaction_order, key_order = order_violations(ledger.committed, ledger.published)
            return cls(
                committed=len(ledger.committed),
                published=len(publishes),
                publishes=len(ledger.published),
                not_drained=len(unpublished & still_pending),
                lost=len(unpublished - still_pending),
                duplicated=sum(times - 1 for times in publishes.values()),
                phantom=len(publishes.keys() & ledger.rolled_back),
                transaction_order=transaction_order,
                key_order=key_order,
                drained_in=drained_in,
            )

    def failures(self) -> list[str]:
        """What went wrong; empty if the soak passed."""
        found = [
            f"{count:,} {what}"
            for what, count in (
                ("lost", self.lost),
                ("duplicated", self.duplicated),
                ("phantom", self.phantom),
                ("out of order in their transaction", self.transaction_order),
                ("out of order in their key", self.key_order),
            )
            if count
        ]
        if self.drained_in is None:
            found.insert(0, f"{self.not_drained:,} not drained")
        return found


# --- the run ------------------------------------------------------------------------------------


def _progress(phase: str, seconds: float, ledger: Ledger, app: sa.Engine) -> None:
    committed, published, _ = ledger.counts()
    try:
        state = outbox_state(app)
        rows = f"pending {state.pending:,}, parked {state.parked:,}"
    except sa.exc.SQLAlchemyError as error:
        rows = f"outbox unreadable ({type(error).__name__})"
    print(
        f"[{phase} {seconds:5.1f} s] committed {committed:,}, published {published:,}, {rows}",
        flush=True,
    )


def wait_for_drain(seconds: float, ledger: Ledger, app: sa.Engine) -> float | None:
    """Seconds until every committed message was published, or None after ``seconds``."""
    stopped = time.monotonic()
    report_at = stopped + REPORT_EVERY
    while True:
        now = time.monotonic()
        if ledger.drained():
            return now - stopped
        if now - stopped >= seconds:
            return None
        if now >= report_at:
            _progress("draining", now - stopped, ledger, app)
            report_at += REPORT_EVERY
        time.sleep(0.05)


def run(args: argparse.Namespace, url: URL, events: EventCounter) -> int:
    """The soak on a fresh database; the exit status."""
    app = outbox.create_engine(url, pool_size=args.writers + 2)
    outbox.metadata.create_all(app)
    connect_args = {"application_name": RELAY_APPLICATION} if is_postgresql(url) else {}
    relay_engine = outbox.create_engine(
        url, connect_args=connect_args, pool_size=max(5, 3 * args.relays)
    )
    ledger = Ledger()
    publisher = Publisher(ledger, args.fail)
    relays = [
        outbox.Relay(
            relay_engine,
            publisher,
            batch_size=BATCH_SIZE,
            retry_base=RETRY_BASE,
            retry_max=RETRY_MAX,
            claim_lease=CLAIM_LEASE,
        )
        for _ in range(args.relays)
    ]
    shape = Shape(args.keyed, args.keys_per_writer)
    stop = threading.Event()
    threads = [
        threading.Thread(target=write, args=(n, app, shape, ledger, stop), name=f"writer-{n}")
        for n in range(args.writers)
    ]
    kills: list[int] = []
    admin: sa.Engine | None = None
    if args.kill:
        admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        killer = threading.Thread(
            target=kill_relays, args=(admin, url.database, stop, kills), name="killer"
        )
        threads.append(killer)
    drained_in: float | None = None
    alive: list[bool] = []
    try:
        for relay in relays:
            relay.start()
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while (elapsed := time.monotonic() - started) < args.seconds:
            time.sleep(min(REPORT_EVERY, args.seconds - elapsed))
            _progress("writing", time.monotonic() - started, ledger, app)
        stop.set()
        for thread in threads:
            thread.join()
        print(f"writers stopped after {time.monotonic() - started:.1f} s; draining", flush=True)
        drained_in = wait_for_drain(args.drain, ledger, app)
        alive = [relay.is_alive() for relay in relays]
    finally:
        stop.set()
        for relay in relays:
            relay.stop()
        if admin is not None:
            admin.dispose()
    state = outbox_state(app)
    outcome = Outcome.count(ledger, pending_names(app), drained_in)
    app.dispose()
    relay_engine.dispose()
    _summary(
        args,
        url=url,
        ledger=ledger,
        outcome=outcome,
        state=state,
        alive=alive,
        kills=sum(kills),
        events=events,
    )
    return 1 if outcome.failures() else 0


def _summary(
    args: argparse.Namespace,
    *,
    url: URL,
    ledger: Ledger,
    outcome: Outcome,
    state: OutboxState,
    alive: list[bool],
    kills: int,
    events: EventCounter,
) -> None:
    keys = args.writers * args.keys_per_writer
    killed = f"{kills:,} relay connections killed" if args.kill else "no kills"
    print()
    print(
        f"soak on {url.get_backend_name()} ({url.database}): {args.writers} writers for "
        f"{args.seconds:g} s, {args.keyed:.0%} keyed on {keys} hot keys, {args.relays} relays "
        f"(batch {BATCH_SIZE}, retry {RETRY_BASE:g}-{RETRY_MAX:g} s, lease {CLAIM_LEASE:g} s), "
        f"{args.fail:.1%} failing once, {killed}"
    )
    if outcome.drained_in is not None:
        drain = f"everything published {outcome.drained_in:.1f} s after the writers stopped"
    else:
        drain = (
            f"NOT drained in {args.drain:g} s after the writers stopped: "
            f"{outcome.not_drained:,} committed messages left"
        )
    print(
        f"committed {outcome.committed:,}, published {outcome.published:,} "
        f"({outcome.publishes:,} publishes); {drain}"
    )
    print(
        f"lost {outcome.lost} duplicated {outcome.duplicated} phantom {outcome.phantom} "
        f"tx-order-violations {outcome.transaction_order} "
        f"key-order-violations {outcome.key_order}"
    )
    with ledger.lock:
        refused, uncertain = len(ledger.refused), len(ledger.uncertain)
        errors = ", ".join(f"{n} {name}" for name, n in ledger.writer_errors.most_common())
    print(
        f"refused once {refused:,}; writer errors: {errors or 'none'}"
        + (f" ({uncertain:,} messages of failed commits not checked)" if uncertain else "")
    )
    print(
        f"outbox at the end: {state.pending:,} unpublished ({state.parked:,} parked, "
        f"{state.claimed:,} claimed, {state.dead:,} dead); relays alive before stop: {alive}"
    )
    logged = ", ".join(f"{event} {n:,}" for event, n in events.counts.most_common())
    where = f"; full log in {args.log}" if args.log else ""
    print(f"relay log, warnings and errors: {logged or 'none'}{where}")
    failures = outcome.failures()
    print(f"FAIL: {'; '.join(failures)}" if failures else "PASS")


# --- the command --------------------------------------------------------------------------------


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share between 0 and 1, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a positive number, got {text}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description="Writers and relays on hot ordering keys with publishes failing once; "
        "then every message accounted for. Exits 1 if any is lost, duplicated, phantom, out "
        "of order or not drained.",
    )
    parser.add_argument(
        "--url",
        default=DEFAULT_URL,
        help="postgresql+psycopg or mysql+pymysql URL; its database is DROPPED and recreated "
        "(default: %(default)s)",
    )
    parser.add_argument("--seconds", type=_positive_float, default=20.0, help="writing time")
    parser.add_argument(
        "--drain",
        type=float,
        default=60.0,
        help="seconds to wait, once the writers stop, for every message to be published",
    )
    parser.add_argument(
        "--fail", type=_share, default=0.02, help="share of messages whose first publish fails"
    )
    parser.add_argument(
        "--keyed", type=_share, default=0.7, help="share of messages with an ordering key"
    )
    parser.add_argument("--keys-per-writer", type=_positive_int, default=4)
    parser.add_argument("--writers", type=_positive_int, default=4)
    parser.add_argument("--relays", type=_positive_int, default=2)
    parser.add_argument(
        "--kill",
        action="store_true",
        help="terminate the relays' connections every 0.3 s while writing (PostgreSQL only)",
    )
    parser.add_argument(
        "--log", metavar="PATH", help="write the relays' log there (default: only counted)"
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="lowest level written to --log (default: %(default)s; DEBUG: a line per pass)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args(argv)
    url = sa.make_url(args.url)
    backend = url.get_backend_name()
    if backend != "postgresql" and backend not in MYSQL_BACKENDS:
        parser.exit(2, f"{parser.prog}: error: --url must be PostgreSQL or MySQL/MariaDB\n")
    if not url.database:
        parser.exit(2, f"{parser.prog}: error: --url must name a database\n")
    if args.kill and backend != "postgresql":
        parser.exit(
            2,
            f"{parser.prog}: error: --kill terminates connections with pg_terminate_backend: "
            "PostgreSQL only\n",
        )
    args.url = url
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    url: URL = args.url
    events = route_relay_logs(args.log, logging.getLevelName(args.log_level))
    try:
        recreate_database(url)
    except sa.exc.DBAPIError as error:
        print(f"soak: cannot create {url.database}: {error.orig}", file=sys.stderr)
        return 2
    try:
        return run(args, url, events)
    finally:
        if args.keep:
            print(f"kept the database {url.database}")
        else:
            drop_database(url)


if __name__ == "__main__":
    sys.exit(main())
