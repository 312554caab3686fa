"""Retention, on PostgreSQL and SQLite: ``outbox.purge``, ``sqla-outbox purge`` and a relay's
background purge (``Relay(..., retain_published=...)``).

Rows are made with ``enqueue`` and then given the state a test needs (published some days ago,
a dead letter, scheduled for later) by setting their columns directly, so no test waits for a
clock. The concurrency test pauses its publisher until the database shows what it waits for.
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from support import (
    REPO,
    WAIT,
    MakeRelay,
    cli_command,
    cli_env,
    logged,
    stage,
    url_of,
    wait_until,
)

import sqla_outbox as outbox
from sqla_outbox import queries, retention
from sqla_outbox.cli import main
from sqla_outbox.engines import create_engine
from sqla_outbox.message import OutboxMessage

DAY = dt.timedelta(days=1)
WEEK = dt.timedelta(days=7)
T = outbox.OutboxRow


def ago(delta: dt.timedelta) -> dt.datetime:
    """An aware UTC instant ``delta`` before now."""
    return dt.datetime.now(dt.timezone.utc) - delta


def set_rows(engine: Engine, messages: list[OutboxMessage], **values: Any) -> None:
    """Set ``values`` on the rows of ``messages``."""
    with engine.begin() as conn:
        conn.execute(update(T).where(T.id.in_([m.id for m in messages])).values(**values))


def ids(engine: Engine) -> set[uuid.UUID]:
    """The ids of every row in the outbox."""
    with engine.connect() as conn:
        return set(conn.execute(select(T.id)).scalars())


def ids_of(messages: list[OutboxMessage]) -> set[uuid.UUID]:
    """The ids of ``messages``."""
    return {message.id for message in messages}


class History:
    """One row of each kind a purge must tell apart, all staged in the same way."""

    def __init__(self, engine: Engine, old_published: int = 3) -> None:
        self.old_published = stage(engine, "history", old_published)
        set_rows(engine, self.old_published, published_at=ago(10 * DAY), staged_at=ago(11 * DAY))
        self.recent = stage(engine, "history", 2)
        set_rows(engine, self.recent, published_at=ago(DAY), staged_at=ago(2 * DAY))
        # Staged a month ago and never published: scheduled far ahead, so no relay takes it.
        self.old_unpublished = stage(engine, "history", 1)
        set_rows(
            engine,
            self.old_unpublished,
            staged_at=ago(30 * DAY),
            run_at=ago(-365 * DAY),
            claimed_by="relay-gone:0",
            claimed_at=ago(29 * DAY),
        )
        self.dead = stage(engine, "history", 1)
        set_rows(
            engine,
            self.dead,
            staged_at=ago(30 * DAY),
            dead_at=ago(29 * DAY),
            attempts=10,
            last_error="RuntimeError: broker said no",
        )

    @property
    def kept(self) -> set[uuid.UUID]:
        """What a purge of rows older than a week must leave."""
        return ids_of(self.recent + self.old_unpublished + self.dead)


@pytest.fixture
def statements(engine: Engine) -> Iterator[list[str]]:
    """The engine's statements from now on, in order: ``DELETE`` for each executed delete and
    ``COMMIT`` for each commit (other statements are left out)."""
    seen: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            seen.append("DELETE")

    def commit(conn: Any) -> None:
        seen.append("COMMIT")

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "commit", commit)
    yield seen
    event.remove(engine, "before_cursor_execute", before)
    event.remove(engine, "commit", commit)


# --- outbox.purge ------------------------------------------------------------------------------


def test_purge_deletes_exactly_the_published_rows_older_than_the_cutoff(engine: Engine) -> None:
    """purge(older_than=7 days) deletes the rows published ten days ago and returns how many;
    rows published yesterday, an unpublished row staged a month ago (claimed by a relay long
    gone) and a month-old dead letter all stay, untouched. A cutoff before the year 1
    (timedelta.max) deletes nothing."""
    history = History(engine)
    with engine.connect() as conn:
        before = {row.id: tuple(row) for row in conn.execute(select(T.__table__))}

    assert outbox.purge(engine, older_than=dt.timedelta.max) == 0
    assert outbox.purge(engine, older_than=WEEK) == 3

    assert ids(engine) == history.kept
    with engine.connect() as conn:
        after = {row.id: tuple(row) for row in conn.execute(select(T.__table__))}
    assert after == {key: before[key] for key in history.kept}
    assert outbox.purge(engine, older_than=WEEK) == 0


def test_purge_takes_a_url_and_the_cutoff_is_older_than(engine: Engine) -> None:
    """purge accepts a database URL (opening and disposing an engine of its own), and
    older_than is the cutoff: 12 hours deletes yesterday's rows too, never the unpublished or
    dead ones."""
    history = History(engine)
    assert outbox.purge(url_of(engine), older_than=dt.timedelta(hours=12)) == 5
    assert ids(engine) == ids_of(history.old_unpublished + history.dead)


def test_purge_runs_in_batches_of_their_own_transactions(
    engine: Engine, statements: list[str]
) -> None:
    """With batch_size=10, 25 old published rows go in three DELETEs (10, 10, 5), each
    committed before the next starts; purge_batches yields the per-batch counts, and a batch
    smaller than batch_size ends the purge (no fourth, empty DELETE)."""
    History(engine, old_published=25)
    statements.clear()

    assert outbox.purge(engine, older_than=WEEK, batch_size=10) == 25

    first = statements.index("DELETE")
    assert statements[first:] == ["DELETE", "COMMIT"] * 3

    History(engine, old_published=20)
    with engine.connect() as conn:
        cutoff = retention.purge_cutoff(conn, WEEK)
    assert list(retention.purge_batches(engine, cutoff, 10)) == [10, 10, 0]
    assert list(retention.purge_batches(engine, cutoff, 10, max_batches=1)) == [0]


def test_purge_statement_locks_skips_and_uses_the_index() -> None:
    """The purge statement, compiled: on PostgreSQL the oldest published rows are chosen in
    published_at order and locked FOR UPDATE SKIP LOCKED, the delete probes the primary key with
    = ANY(ARRAY(...)); on SQLite (no row locks) a plain IN (...)."""
    pg = str(queries.purge_stmt("postgresql").compile(dialect=postgresql.dialect()))
    assert pg.startswith("DELETE FROM outbox WHERE outbox.id = ANY (array((SELECT outbox.id")
    assert "WHERE outbox.published_at < %(cutoff)s" in pg
    assert "ORDER BY outbox.published_at" in pg
    assert pg.rstrip(")").endswith("FOR UPDATE SKIP LOCKED")
    lite = str(queries.purge_stmt("sqlite").compile(dialect=sqlite.dialect()))
    assert lite.startswith("DELETE FROM outbox WHERE outbox.id IN (SELECT outbox.id")
    assert "FOR UPDATE" not in lite


def test_purge_reads_the_index_over_published_rows(engine: Engine) -> None:
    """The database plans the purge's batch through ix_outbox_published (on PostgreSQL with
    sequential scans off, so the small test table does not hide which index is usable): the
    index's predicate (published_at IS NOT NULL) is implied by the purge's condition."""
    History(engine)
    statement = queries.purge_stmt(engine.dialect.name).compile(dialect=engine.dialect)
    cutoff = ago(WEEK)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            params: Any = {"cutoff": cutoff, "limit": 10}
            plan = conn.exec_driver_sql(f"EXPLAIN {statement}", params).scalars().all()
        else:
            params = (str(cutoff.replace(tzinfo=None)), 10, 0)
            plan = [
                row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
            ]
    assert any("ix_outbox_published" in line for line in plan), plan


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"older_than": 7},
            "older_than must be a positive datetime.timedelta such as timedelta(days=7), got 7.",
        ),
        ({"older_than": dt.timedelta(0)}, "got datetime.timedelta(0)."),
        ({"older_than": -DAY}, "got datetime.timedelta(days=-1)."),
        ({"older_than": "7d"}, "got '7d'."),
        (
            {"older_than": WEEK, "batch_size": 0},
            "batch_size must be a positive whole number of rows such as 10000, got 0.",
        ),
        ({"older_than": WEEK, "batch_size": True}, "got True."),
        ({"older_than": WEEK, "batch_size": 2.5}, "got 2.5."),
    ],
)
def test_purge_refuses_bad_arguments_in_one_sentence(
    arguments: dict[str, Any], message: str
) -> None:
    """A bad older_than or batch_size is a ConfigurationError (a ValueError) of one sentence
    naming the argument, the value and an example, raised before anything connects."""
    with pytest.raises(outbox.ConfigurationError) as caught:
        outbox.purge("postgresql+psycopg://nobody@invalid.invalid/none", **arguments)
    text_ = str(caught.value)
    assert text_.endswith(message)
    assert "\n" not in text_ and text_.count(". ") == 0
    assert isinstance(caught.value, ValueError)


@pytest.fixture(params=["postgresql", "sqlite"])
def bare_url(request: pytest.FixtureRequest) -> URL:
    """An empty PostgreSQL database or SQLite file."""
    url: URL = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    return url


def test_purge_refuses_a_missing_or_version_2_table(bare_url: URL) -> None:
    """Without a table purge raises MissingTableError naming op.create_outbox_table(version=5),
    the current version; on a version-2 table (no index to purge by) SchemaVersionError naming
    op.upgrade_outbox_table(2, 5), deleting nothing."""
    from alembic.operations import Operations  # noqa: PLC0415 - only this test migrates
    from alembic.runtime.migration import MigrationContext  # noqa: PLC0415

    import alembic_ext  # noqa: F401, PLC0415 - registers op.create_outbox_table

    current = outbox.SCHEMA_VERSION
    engine = create_engine(bare_url)
    try:
        create = rf"create_outbox_table\(version={current}\)"
        with pytest.raises(outbox.MissingTableError, match=create):
            outbox.purge(engine, older_than=WEEK)
        with engine.begin() as conn:
            op: Any = Operations(MigrationContext.configure(conn))
            op.create_outbox_table(version=2)
        upgrade = rf"upgrade_outbox_table\(2, {current}\)"
        with pytest.raises(outbox.SchemaVersionError, match=upgrade):
            outbox.purge(engine, older_than=WEEK)
    finally:
        engine.dispose()


# --- beside a relay ----------------------------------------------------------------------------

RECORD_DELETES = """
CREATE TABLE purged (id uuid PRIMARY KEY, published_at timestamptz NOT NULL);
CREATE FUNCTION record_purge() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.published_at IS NULL THEN
        RAISE EXCEPTION 'an unpublished outbox row was deleted';
    END IF;
    INSERT INTO purged VALUES (OLD.id, OLD.published_at);
    RETURN OLD;
END $$;
CREATE TRIGGER outbox_purged BEFORE DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION record_purge();
"""


def purged_ids(engine: Engine) -> set[uuid.UUID]:
    """The ids the trigger of RECORD_DELETES recorded as deleted."""
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT id FROM purged")).scalars())


class PurgeLoops:
    """Threads that each call ``outbox.purge(engine, **arguments)`` over and over, from the
    moment all of them and the test have reached ``started`` until :meth:`stop`; ``counts``
    holds what each call returned, ``errors`` what ended a thread."""

    def __init__(self, engine: Engine, threads: int, **arguments: Any) -> None:
        self.engine = engine
        self.arguments = arguments
        self.started = threading.Barrier(threads + 1)
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.counts: list[int] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        self.started.wait(WAIT)
        try:
            while not self.done.is_set():
                deleted = outbox.purge(self.engine, **self.arguments)
                with self.lock:
                    self.counts.append(deleted)
        except BaseException as error:
            self.errors.append(error)

    def stop(self) -> None:
        """End the loops after the purge each is running, and wait for them."""
        self.done.set()
        for thread in self.threads:
            thread.join(WAIT)


def test_purges_beside_a_draining_relay_lose_and_duplicate_nothing(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Two purges loop (older_than one microsecond, batches of 50) while a relay drains 2,000
    messages over 4,000 rows of old history, on PostgreSQL. A trigger records every deleted row
    and refuses to delete an unpublished one. The publisher pauses mid-drain until a purge has
    deleted rows this relay published, so the two provably interleave. Then: every staged
    message was published exactly once, every row is either still there (published) or was
    deleted once after being published, and the purges' counts add up to the rows deleted."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(RECORD_DELETES)
    history = stage(pg_engine, "history", 4000)
    set_rows(pg_engine, history, published_at=ago(10 * DAY))
    staged: list[OutboxMessage] = []
    for _ in range(20):
        staged += stage(pg_engine, "orders", 100)
    staged_ids = ids_of(staged)
    published: list[uuid.UUID] = []

    def publish(message: OutboxMessage) -> None:
        published.append(message.id)  # one relay thread publishes, in order
        if len(published) == 1000:  # mid-drain: earlier passes are marked, so purgeable
            wait_until(
                lambda: bool(staged_ids & purged_ids(pg_engine)),
                "a purge to delete rows the relay published",
            )

    loops = PurgeLoops(pg_engine, 2, older_than=dt.timedelta(microseconds=1), batch_size=50)
    relay = make_relay(pg_engine, publish, batch_size=100, poll_only=True)
    loops.started.wait(WAIT)
    try:
        result = relay.drain()
    finally:
        loops.stop()
    assert loops.errors == []
    assert (result.published, result.failed) == (2000, False)

    assert sorted(published) == sorted(staged_ids)  # each exactly once
    with pg_engine.connect() as conn:
        remaining = {row.id: row.published_at for row in conn.execute(select(T.id, T.published_at))}
    purged = purged_ids(pg_engine)
    assert None not in remaining.values()
    assert not purged & set(remaining)
    assert purged | set(remaining) == staged_ids | ids_of(history)
    assert sum(loops.counts) == len(purged)
    assert purged & staged_ids


# --- the console script ------------------------------------------------------------------------


def test_cli_purge_prints_how_many_it_deleted(engine: Engine) -> None:
    """`sqla-outbox purge --url URL --older-than 7d` deletes the old published rows, prints one
    line with the count and exits 0; run again, it deletes nothing and says so."""
    history = History(engine)
    url = url_of(engine)
    assert main(["purge", "--url", url, "--older-than", "7d"]) == 0
    assert ids(engine) == history.kept
    assert main(["purge", "--url", url, "--older-than", "1w", "--batch-size", "1"]) == 0


def test_cli_purge_output(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    """The command's output is one sentence with the count and the duration as read."""
    History(engine)
    assert main(["purge", "--url", url_of(engine), "--older-than", "168h"]) == 0
    assert capsys.readouterr().out == "Purged 3 published rows older than 7d.\n"
    assert main(["purge", "--url", url_of(engine), "--older-than", "12h"]) == 0
    assert capsys.readouterr().out == "Purged 2 published rows older than 12h.\n"


@pytest.mark.parametrize(
    ("duration", "message"),
    [
        (
            "7",
            "'7' is not a duration: write a whole number and a unit, e.g. 90s, 15m, 12h, 7d or 2w.",
        ),
        ("7x", "'7x' is not a duration"),
        ("1.5d", "'1.5d' is not a duration"),
        ("-1d", "'-1d' is not a duration"),
        ("", "'' is not a duration"),
        ("0d", "'0d' is not a positive duration; write one e.g. 90s, 15m, 12h, 7d or 2w."),
        ("9999999999999d", "'9999999999999d' is longer than any outbox row can be old"),
    ],
)
def test_cli_purge_refuses_bad_durations(
    duration: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A duration that is not a whole number and one of s, m, h, d, w (or is zero, or past what
    a timedelta holds) is a usage error: exit 2, one line naming --older-than and the value, and
    nothing connects (the URL is never read)."""
    code = main(["purge", "--url", "sqlite:////nonexistent/outbox.db", "--older-than", duration])
    assert code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("Error: Invalid value for '--older-than'")
    assert message in error
    assert "Traceback" not in error


def test_cli_purge_requires_older_than_and_a_sane_batch_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without --older-than (a purge has no default age) and with --batch-size 0 the command
    is a usage error naming the option, exit 2."""
    assert main(["purge", "--url", "sqlite:////nonexistent/outbox.db"]) == 2
    assert "Missing option '--older-than'. Pass e.g. --older-than 7d" in capsys.readouterr().err
    url = "sqlite:////nonexistent/outbox.db"
    assert main(["purge", "--url", url, "--older-than", "7d", "--batch-size", "0"]) == 2
    assert "Invalid value for '--batch-size'" in capsys.readouterr().err


def test_cli_purge_on_a_version_2_table_names_the_migration(
    sqlite_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    """Against a version-2 table the command exits 1 with the one sentence naming
    op.upgrade_outbox_table(2, 5), the move to the current version."""
    from alembic.operations import Operations  # noqa: PLC0415 - only this test migrates
    from alembic.runtime.migration import MigrationContext  # noqa: PLC0415

    import alembic_ext  # noqa: F401, PLC0415 - registers op.create_outbox_table

    engine = create_engine(sqlite_url)
    with engine.begin() as conn:
        op: Any = Operations(MigrationContext.configure(conn))
        op.create_outbox_table(version=2)
    engine.dispose()
    assert main(["purge", "--url", str(sqlite_url), "--older-than", "7d"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("Error: Table 'outbox' is schema version 2;")
    assert f"op.upgrade_outbox_table(2, {outbox.SCHEMA_VERSION})" in line


def test_cli_relay_retain_published_purges_while_idle(engine: Engine, tmp_path: Path) -> None:
    """`sqla-outbox relay --retain-published 7d`, a process of its own, purges the rows published
    more than a week ago once it is idle and logs event=relay.purged; on SIGTERM it exits 0, the
    recent, scheduled and dead rows still there."""
    history = History(engine)
    stderr_path = tmp_path / "relay.stderr"
    command = cli_command("relay", "--publisher", "stdout", "--retain-published", "7d")
    with (
        stderr_path.open("w") as stderr,
        subprocess.Popen(
            command,
            env=cli_env(url=url_of(engine)),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        ) as process,
    ):
        try:
            wait_until(lambda: not ids(engine) & ids_of(history.old_published), "the relay's purge")
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=WAIT) == 0, stderr_path.read_text()
    log = stderr_path.read_text()
    assert "event=relay.purged" in log and " rows=3 " in log, log
    assert "Traceback" not in log
    assert ids(engine) == history.kept


def test_cli_relay_refuses_a_bad_retain_published(capsys: pytest.CaptureFixture[str]) -> None:
    """`sqla-outbox relay --retain-published` takes the same durations: a bad one is a usage
    error naming the option, exit 2, before anything connects."""
    code = main(
        [
            "relay",
            "--url",
            "sqlite:////nonexistent/outbox.db",
            "--publisher",
            "stdout",
            "--retain-published",
            "a week",
        ]
    )
    assert code == 2
    error = capsys.readouterr().err
    assert "Invalid value for '--retain-published'" in error
    assert "'a week' is not a duration" in error


# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text_", "expected", "shown"),
    [
        ("90s", dt.timedelta(seconds=90), "90s"),
        ("15m", dt.timedelta(minutes=15), "15m"),
        ("12h", dt.timedelta(hours=12), "12h"),
        ("7d", WEEK, "7d"),
        (" 2W ", 2 * WEEK, "14d"),
        ("36h", dt.timedelta(hours=36), "36h"),
        ("120m", dt.timedelta(hours=2), "2h"),
    ],
)
def test_durations_read_and_written(text_: str, expected: dt.timedelta, shown: str) -> None:
    """parse_duration reads a whole number and a unit (s, m, h, d, w; any case, spaces around);
    format_duration writes the largest whole unit up to days."""
    assert retention.parse_duration(text_) == expected
    assert retention.format_duration(expected) == shown


# --- a relay's background purge ------------------------------------------------------------------


def test_relay_refuses_a_bad_retain_published(engine: Engine) -> None:
    """Relay(..., retain_published=...) takes a positive timedelta or None; anything else is a
    ConfigurationError from the constructor naming retain_published."""
    for value in (7, dt.timedelta(0), "7d"):
        with pytest.raises(outbox.ConfigurationError, match=r"^retain_published must be a "):
            outbox.Relay(engine, lambda message: None, retain_published=value)  # type: ignore[arg-type]
    relay = outbox.Relay(engine, lambda message: None)
    assert relay.retention is None
    relay.close()


def test_relay_retention_round_is_bounded_and_catches_up(
    engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """A round deletes at most max_batches batches: with 15 old published rows, batches of 4
    and 2 per round, the first round deletes 8 and is behind (the next round is due at once),
    the second deletes the other 7 and is not (the next is a whole interval away). Each logs
    event=relay.purged with the rows; the recent, unpublished and dead rows stay."""
    history = History(engine, old_published=15)
    relay = make_relay(engine, lambda message: None, retain_published=WEEK)
    assert relay.retention is not None
    relay.retention.batch_size, relay.retention.max_batches = 4, 2

    with caplog.at_level(logging.INFO, logger="sqla_outbox"):
        assert relay.retention.run_round() == 8
        assert relay.retention.behind and relay.retention.due()
        assert relay.retention.run_round() == 7
        assert not relay.retention.behind and not relay.retention.due()
    assert ids(engine) == history.kept
    lines = logged(caplog, "relay.purged")
    assert [line.split(" rows=")[1].split()[0] for line in lines] == ["8", "7"]
    assert "older_than=7d" in lines[0] and "more=True" in lines[0]


def test_background_purge_cadence_and_failures(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """With a clock the test moves: the first round is due at once; after a round that caught
    up, the next is due only once `interval` has passed; a round that fails (the table is gone)
    logs event=relay.purge_failed instead of raising and is retried an interval later."""
    now = [1000.0]
    purge = retention.BackgroundPurge(
        engine, WEEK, relay_id="relay-test", interval=60.0, clock=lambda: now[0]
    )
    History(engine)
    assert purge.due()
    assert purge.run_if_due() is False  # caught up: nothing more to do at once
    assert not purge.due()
    now[0] += 59.0
    assert not purge.due()
    now[0] += 1.0
    assert purge.due()

    outbox.metadata.drop_all(engine)
    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        assert purge.run_if_due() is False
    [line] = logged(caplog, "relay.purge_failed")
    assert "relay=relay-test" in line and "retry_in=60.0" in line and "MissingTableError" in line
    assert not purge.due()
    now[0] += 60.0
    assert purge.due()


def test_relay_purges_old_published_rows_while_idle(
    engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """A started relay with retain_published=7 days publishes what is due, then, idle, purges
    the rows published more than a week ago and logs it; what it has just published, the recent
    rows, the scheduled row and the dead letter stay."""
    history = History(engine)
    fresh = stage(engine, "orders", 3)
    published: list[uuid.UUID] = []
    relay = make_relay(engine, lambda m: published.append(m.id), retain_published=WEEK)

    def purged() -> bool:
        return not ids(engine) & ids_of(history.old_published)

    with caplog.at_level(logging.INFO, logger="sqla_outbox"):
        relay.start()
        wait_until(purged, "the relay's background purge")
        wait_until(lambda: len(published) == 3, "the relay to publish the fresh rows")
        relay.stop()
    assert set(published) == ids_of(fresh)
    assert ids(engine) == history.kept | ids_of(fresh)
    [line] = logged(caplog, "relay.purged")
    assert " rows=3 " in line
