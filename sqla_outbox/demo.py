"""``sqla-outbox demo``: the outbox story end to end, on a throwaway SQLite database.

It shows, on real transactions rather than in prose, the three promises a user has to believe
before adopting an outbox:

1. a job commits with the business rows or not at all (a rolled-back order sends no receipt),
2. a rolled-back SAVEPOINT drops exactly the jobs staged inside it,
3. several relays can publish concurrently, each message once (at least once in general).

It then *checks* the second half of 1 and 2 against what the relays actually published and
exits 1 if anything rolled back got out, so the demo doubles as a smoke test of an install.

Everything lives in a temporary directory that is removed afterwards (``--keep`` keeps it).
The relays publish to stdout through :class:`StdoutPublisher`, each line prefixed with the
relay's id so the reader can see the work being shared.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session

from sqla_outbox.engines import create_engine
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import SCHEMA_VERSION, OutboxRow, metadata
from sqla_outbox.publishers.stdout import StdoutPublisher
from sqla_outbox.relay import Relay
from sqla_outbox.staging import enqueue

__all__ = ["run_demo"]

RELAY_IDS = ("relay-a", "relay-b")
PUBLISH_DELAY = 0.02
"""Seconds each publish takes, standing in for a broker round trip; it lets both relays work."""

_shop = sa.MetaData()
_orders = sa.Table(
    "orders",
    _shop,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("customer", sa.String(50), nullable=False),
    sa.Column("total_cents", sa.Integer, nullable=False),
)

_COMMITTED_ORDERS = [
    (1, "alice", 1250),
    (2, "bob", 830),
    (3, "carol", 4200),
    (4, "dave", 990),
    (5, "erin", 1575),
    (6, "grace", 310),
]


class _PaymentDeclinedError(Exception):
    """Stands in for whatever makes a real business transaction roll back."""


@dataclass
class _Ledger:
    """What the story staged and what the relays published, for the final check."""

    committed: list[OutboxMessage] = field(default_factory=list)
    rolled_back: list[tuple[str, OutboxMessage]] = field(default_factory=list)
    published: list[tuple[str, OutboxMessage]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _DemoPublisher:
    """Prints like ``--publisher stdout`` (prefixed with the relay id) and records what it sent."""

    def __init__(self, relay_id: str, ledger: _Ledger, out: TextIO) -> None:
        self._relay_id = relay_id
        self._ledger = ledger
        self._stdout = StdoutPublisher(out, prefix=f"   {relay_id} | ")

    def publish(self, message: OutboxMessage) -> None:
        time.sleep(PUBLISH_DELAY)
        self._stdout.publish(message)
        with self._ledger.lock:
            self._ledger.published.append((self._relay_id, message))


def run_demo(*, keep: bool = False, out: TextIO | None = None) -> int:
    """Tell the story on a fresh SQLite database; 0 if the rolled-back check passed, else 1."""
    stream = out if out is not None else sys.stdout
    directory = Path(tempfile.mkdtemp(prefix="sqla-outbox-demo-"))
    path = directory / "demo.sqlite3"
    try:
        return _Story(URL.create("sqlite+pysqlite", database=str(path)), stream).tell()
    finally:
        if keep:
            print(f"\nKept the database: sqlite3 {path} 'select * from outbox'", file=stream)
        else:
            shutil.rmtree(directory, ignore_errors=True)


class _Story:
    def __init__(self, url: URL, out: TextIO) -> None:
        self.url = url
        self.out = out
        self.ledger = _Ledger()

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def tell(self) -> int:
        self.say("sqla-outbox demo: the transactional outbox, end to end")
        self.say(f"Database: embedded SQLite at {self.url.database}")
        engine = create_engine(self.url)
        try:
            self._schema(engine)
            self._transactions(engine)
            self._relays(engine)
            return self._summary(engine)
        finally:
            engine.dispose()

    # 1 -----------------------------------------------------------------------------------------

    def _schema(self, engine: Engine) -> None:
        metadata.create_all(engine)
        _shop.create_all(engine)
        self.say("\n1. Schema")
        self.say("   outbox.metadata.create_all(engine) created the outbox table (in production,")
        self.say(
            f"   op.create_outbox_table(version={SCHEMA_VERSION}) in an Alembic migration: name "
            "the version, a bare call"
        )
        self.say("   creates version 1); the shop has an 'orders' table.")

    # 2 -----------------------------------------------------------------------------------------

    def _transactions(self, engine: Engine) -> None:
        self.say("\n2. Business transactions: each order and its job commit together or not at all")
        for order_id, customer, cents in _COMMITTED_ORDERS:
            with Session(engine) as session, session.begin():
                self._order(session, order_id, customer, cents)
                message = enqueue(session, "send_receipt", {"order_id": order_id})
            self.ledger.committed.append(message)
            self.say(f"   COMMIT    order {order_id} {customer:<8}{_money(cents)}  + send_receipt")

        # A transaction that fails after staging its job: the order and the job vanish together.
        with Session(engine) as session:
            try:
                with session.begin():
                    self._order(session, 7, "mallory", 9900)
                    message = enqueue(session, "send_receipt", {"order_id": 7})
                    raise _PaymentDeclinedError
            except _PaymentDeclinedError:
                self.ledger.rolled_back.append(("mallory's send_receipt", message))
        self.say(
            f"   ROLLBACK  order 7 {'mallory':<8}{_money(9900)}  + send_receipt"
            "   (card declined: order and job gone together)"
        )

        # A committed transaction with a SAVEPOINT rolled back inside it: only the savepoint's
        # job is dropped; the order's own job commits.
        with Session(engine) as session, session.begin():
            self._order(session, 8, "frank", 2100)
            receipt = enqueue(session, "send_receipt", {"order_id": 8})
            try:
                with session.begin_nested():
                    wrap = enqueue(session, "wrap_gift", {"order_id": 8})
                    raise _PaymentDeclinedError  # the gift-wrap add-on is declined
            except _PaymentDeclinedError:
                self.ledger.rolled_back.append(("frank's wrap_gift", wrap))
        self.ledger.committed.append(receipt)
        self.say(
            f"   COMMIT    order 8 {'frank':<8}{_money(2100)}  + send_receipt; inside it, a "
            "SAVEPOINT"
        )
        self.say("             that staged wrap_gift was rolled back (add-on declined)")

        with engine.connect() as conn:
            rows = conn.execute(sa.select(sa.func.count()).select_from(OutboxRow)).scalar_one()
        self.say(
            f"   The outbox holds {rows} rows, one per committed job; the "
            f"{len(self.ledger.rolled_back)} jobs staged in rolled-back work were never written."
        )

    def _order(self, session: Session, order_id: int, customer: str, cents: int) -> None:
        session.execute(
            sa.insert(_orders).values(id=order_id, customer=customer, total_cents=cents)
        )

    # 3 -----------------------------------------------------------------------------------------

    def _relays(self, engine: Engine) -> None:
        self.say("\n3. Two relays publish concurrently to stdout (one JSON object per line)")
        self.say("   Each claims batches of 2; a row claimed by one is never handed to the other.")
        relays = [
            Relay(
                engine,
                _DemoPublisher(relay_id, self.ledger, self.out),
                batch_size=2,
                poll_interval=0.05,
                relay_id=relay_id,
            )
            for relay_id in RELAY_IDS
        ]
        # ``drain`` in two threads rather than ``start()``: each returns once nothing due is
        # left, so a join (not a timed wait) says the work is done. Both start together.
        barrier = threading.Barrier(len(relays))
        errors: list[BaseException] = []

        def drain(relay: Relay) -> None:
            try:
                barrier.wait(timeout=5)
                relay.drain()
            except BaseException as error:  # reported below; a thread must not die silently
                errors.append(error)

        threads = [threading.Thread(target=drain, args=(relay,)) for relay in relays]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            for relay in relays:
                if relay.engine is not engine:
                    relay.engine.dispose()
        if errors:
            raise errors[0]

    # 4 -----------------------------------------------------------------------------------------

    def _summary(self, engine: Engine) -> int:
        ledger = self.ledger
        by_relay = Counter(relay_id for relay_id, _ in ledger.published)
        published_ids = [message.id for _, message in ledger.published]
        counts = ", ".join(f"{relay_id} {by_relay[relay_id]}" for relay_id in RELAY_IDS)
        with engine.connect() as conn:
            unpublished = conn.execute(
                sa.select(sa.func.count())
                .select_from(OutboxRow)
                .where(OutboxRow.published_at.is_(None))
            ).scalar_one()
        self.say("\n4. Summary")
        self.say(f"   Published {len(published_ids)} messages ({counts}); {unpublished} pending.")

        leaked = [name for name, m in ledger.rolled_back if m.id in set(published_ids)]
        committed_ids = {m.id for m in ledger.committed}
        missing = committed_ids - set(published_ids)
        duplicates = len(published_ids) - len(set(published_ids))
        names = ", ".join(name for name, _ in ledger.rolled_back)
        if leaked:
            self.say(f"   CHECK FAILED: rolled-back work was published: {', '.join(leaked)}.")
            return 1
        self.say(
            f"   Rolled-back check passed: none of the {len(ledger.rolled_back)} jobs staged in "
            f"rolled-back work ({names}) was published."
        )
        if missing or unpublished:
            self.say(f"   CHECK FAILED: {len(missing)} committed jobs were not published.")
            return 1
        once = "exactly once" if not duplicates else f"at least once ({duplicates} repeats)"
        self.say(f"   Every one of the {len(committed_ids)} committed jobs was published {once}.")
        self.say(
            "   Next: add outbox.metadata to Alembic, enqueue in your transactions, and run "
            "sqla-outbox relay --url ... --publisher module:attribute."
        )
        return 0


def _money(cents: int) -> str:
    return f"{cents / 100:>7.2f}"
