"""The inbox: a message's work runs once per key, however often it is delivered.

On PostgreSQL, SQLite and MariaDB, against the real database: two deliveries of one key
processed at the same time run the work once, whether the first commits or rolls back; bad keys
are refused at the call with the session still usable; old keys are purged in batches.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Column, Engine, Integer, MetaData, Table, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker
from support import wait_until

import sqla_outbox as outbox
from sqla_outbox import inbox
from sqla_outbox.cli import main
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError

business = MetaData()
counters = Table(
    "counters", business, Column("id", Integer, primary_key=True), Column("n", Integer)
)


@pytest.fixture(params=["pg_engine", "sqlite_engine", "mariadb_engine"])
def db(request: pytest.FixtureRequest) -> Iterator[Engine]:
    engine: Engine = request.getfixturevalue(request.param)
    inbox.metadata.create_all(engine)
    business.create_all(engine)
    with engine.begin() as conn:
        conn.execute(counters.insert().values(id=1, n=0))
    yield engine


def counter(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(counters.c.n)).scalar_one())


held = threading.Event()
"""Set by a held delivery once it has received its key and done its work, uncommitted."""


def handle(
    engine: Engine, key: str, *, hold: threading.Event | None = None, commit: bool = True
) -> bool:
    """One delivery: receive the key and, the first time, add 1 to the counter, in one
    transaction; ``hold`` keeps that transaction open until it is set."""
    with Session(engine) as session:
        first = inbox.receive(session, key, consumer="billing")
        if first:
            session.execute(update(counters).values(n=counters.c.n + 1))
        if hold is not None:
            held.set()
            hold.wait()
        if commit:
            session.commit()
        else:
            session.rollback()
    return first


def waiting_on_a_lock(engine: Engine) -> bool:
    """Whether a PostgreSQL session of ``engine``'s database waits for a lock right now."""
    with engine.connect() as conn:
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return bool(conn.execute(text(query)).scalar_one())


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_two_deliveries_at_once_run_the_work_once(db: Engine, first_commits: bool) -> None:
    """The second delivery waits for the first's transaction; if that commits it sees the key
    and skips the work, if it rolls back the second does the work: the counter ends at 1."""
    hold = threading.Event()
    held.clear()
    results: dict[str, bool] = {}

    def deliver(name: str, **kwargs: object) -> None:
        results[name] = handle(db, "order-7:receipt", **kwargs)  # type: ignore[arg-type]

    first = threading.Thread(
        target=deliver, args=("first",), kwargs={"hold": hold, "commit": first_commits}
    )
    first.start()
    assert held.wait(30), "the first delivery did not get as far as its work"
    second = threading.Thread(target=deliver, args=("second",))
    second.start()
    if db.dialect.name == "postgresql":
        wait_until(lambda: waiting_on_a_lock(db), "the second delivery waiting on the first")
    else:  # no view of the wait to read: the second delivery must still be running
        second.join(timeout=0.5)
        assert second.is_alive(), "the second delivery did not wait for the first"
    hold.set()
    first.join(timeout=30)
    second.join(timeout=30)

    assert results == {"first": True, "second": not first_commits}
    assert counter(db) == 1


def test_a_key_is_new_once_per_consumer(db: Engine) -> None:
    with Session(db) as session:
        assert inbox.receive(session, "k1", consumer="billing")
        assert inbox.receive(session, "k1", consumer="shipping")
        session.commit()
    with Session(db) as session:
        assert not inbox.receive(session, "k1", consumer="billing")
        assert inbox.receive(session, "k2", consumer="billing")
        assert not inbox.receive(session, "k2", consumer="billing")  # the same transaction
        session.commit()
    with db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(inbox.InboxRow)).scalar_one() == 3


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [
        (None, ConfigurationError, "key must be a non-empty str, got None"),
        ("", ConfigurationError, "key must be a non-empty str, got ''"),
        ("k" * 256, ConfigurationError, "longer than the column's 255 characters"),
        ("a\x00b", ConfigurationError, "NUL"),
        (42, ArgumentTypeError, "key must be a non-empty str, got 42"),
    ],
)
def test_a_bad_key_is_refused_and_the_session_goes_on(
    db: Engine, key: object, error: type[Exception], match: str
) -> None:
    with Session(db) as session:
        with pytest.raises(error, match=match):
            inbox.receive(session, key)  # type: ignore[arg-type]
        session.execute(update(counters).values(n=5))
        assert inbox.receive(session, "good")
        session.commit()
    assert counter(db) == 5


def test_purge_deletes_the_keys_older_than_the_window(db: Engine) -> None:
    """In batches of their own transactions; the newer keys stay and still deduplicate."""
    with Session(db) as session:
        for n in range(7):
            inbox.receive(session, f"old-{n}")
        inbox.receive(session, "new")
        session.commit()
    month_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)
    with db.begin() as conn:
        row = inbox.InboxRow
        conn.execute(update(row).where(row.key.like("old-%")).values(received_at=month_ago))

    assert inbox.purge(db, older_than=dt.timedelta(days=7), batch_size=3) == 7

    with Session(db) as session:
        assert inbox.receive(session, "old-1")  # purged: outside the window, new again
        assert not inbox.receive(session, "new")
        session.rollback()


def test_the_cli_purges_old_keys(sqlite_engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    """`sqla-outbox inbox purge --older-than 7d` deletes the old keys and says how many; without
    --older-than it is a usage error naming the flag and its variable."""
    inbox.metadata.create_all(sqlite_engine)
    with Session(sqlite_engine) as session:
        inbox.receive(session, "old")
        inbox.receive(session, "new")
        session.commit()
    with sqlite_engine.begin() as conn:
        month_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)
        row = inbox.InboxRow
        conn.execute(update(row).where(row.key == "old").values(received_at=month_ago))
    url = sqlite_engine.url.render_as_string(hide_password=False)

    assert main(["inbox", "purge", "--url", url, "--older-than", "7d"]) == 0
    assert capsys.readouterr().out == "Purged 1 inbox key older than 7d.\n"
    assert main(["inbox", "purge", "--url", url]) == 2
    assert "SQLA_OUTBOX_INBOX_OLDER_THAN" in capsys.readouterr().err


def test_a_handler_runs_once_per_key_and_again_after_a_failure(db: Engine) -> None:
    """Two deliveries of one Redis Streams entry run the function once; a delivery whose
    function raises records nothing, so the next delivery runs it."""
    sessions = sessionmaker(db)
    calls: list[str] = []

    @inbox.handler(sessions, consumer="mailer")
    def send(session: Session, fields: dict[str, str]) -> None:
        calls.append(fields["idempotency_key"])
        if fields.get("fail"):
            raise RuntimeError("the mail server refused")
        session.execute(update(counters).values(n=counters.c.n + 1))

    entry = {"idempotency_key": "k-1", "job": "send_receipt"}
    assert send(entry) is True
    assert send(dict(entry)) is False
    failing = {"idempotency_key": "k-2", "fail": "yes"}
    with pytest.raises(RuntimeError):
        send(failing)
    assert send({"idempotency_key": "k-2"}) is True
    assert calls == ["k-1", "k-2", "k-2"]
    assert counter(db) == 2


def test_each_duplicate_absorbed_is_counted_per_consumer(db: Engine) -> None:
    """``sqla_outbox_inbox_duplicates_total{consumer}`` in the default registry."""

    def counted() -> float:
        value = REGISTRY.get_sample_value(
            "sqla_outbox_inbox_duplicates_total", {"consumer": "counted"}
        )
        return value or 0.0

    before = counted()
    with Session(db) as session:
        assert inbox.receive(session, "c1", consumer="counted")
        session.commit()
    for _ in range(2):
        with Session(db) as session:
            assert not inbox.receive(session, "c1", consumer="counted")
            session.rollback()
    assert counted() - before == 2


def test_status_shows_the_inbox(db: Engine) -> None:
    """``outbox.status`` (and ``sqla-outbox status``) report the inbox's size and oldest key
    when its table is in the database, and nothing of it otherwise."""
    outbox.metadata.create_all(db)
    with Session(db) as session:
        inbox.receive(session, "s1")
        inbox.receive(session, "s2")
        session.commit()
    report = outbox.status(db)
    assert report.inbox is not None and report.inbox.keys == 2
    assert report.inbox.oldest_received_at is not None
    inbox.metadata.drop_all(db)
    assert outbox.status(db).inbox is None
