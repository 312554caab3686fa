"""Staging: what `enqueue` writes, when, and what a rollback of any kind leaves behind.

Every test runs on PostgreSQL and on SQLite (the `engine` fixture), through a real connection.
``test_mysql.py`` imports the test classes and runs them on MariaDB too: keep what they assume
true of every database, and put a test that holds on fewer outside them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine, ForeignKey, String, event, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

import sqla_outbox as outbox


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    sku: Mapped[str] = mapped_column(String(20), unique=True)


class Line(Base):
    __tablename__ = "order_lines"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"))


@pytest.fixture
def db(engine: Engine) -> Engine:
    Base.metadata.create_all(engine)
    return engine


def rows(engine: Engine) -> list[outbox.OutboxRow]:
    with Session(engine) as session:
        stmt = select(outbox.OutboxRow).order_by(outbox.OutboxRow.staged_at, outbox.OutboxRow.id)
        return list(session.scalars(stmt))


def jobs(engine: Engine) -> list[str]:
    return [row.job for row in rows(engine)]


class TestCommit:
    def test_commit_writes_exactly_the_staged_rows_with_every_field(self, db: Engine) -> None:
        """A commit inserts each staged message with every field as given, aware UTC timestamps."""
        run_at = dt.datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
        trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        with Session(db) as session:
            session.add(Order(sku="A1"))
            message = outbox.enqueue(
                session,
                "send_receipt",
                {"order": "A1", "lines": [1, 2], "note": None},
                queue="emails",
                run_at=run_at,
                idempotency_key="receipt-A1",
                tenant_id="acme",
                enqueued_by="user:42",
                traceparent=trace,
                max_attempts=7,
            )
            assert outbox.staged(session) == (message,)
            assert rows(db) == []  # nothing before commit
            session.commit()
            assert outbox.staged(session) == ()

        [row] = rows(db)
        assert isinstance(row.id, uuid.UUID) and row.id == message.id
        assert (row.job, row.queue, row.input) == ("send_receipt", "emails", message.input)
        assert row.idempotency_key == "receipt-A1"
        assert (row.tenant_id, row.enqueued_by, row.traceparent) == ("acme", "user:42", trace)
        assert row.max_attempts == 7
        assert row.run_at == run_at and row.run_at.tzinfo == dt.timezone.utc
        assert row.staged_at == message.staged_at and row.staged_at.tzinfo == dt.timezone.utc
        assert row.claimed_by is None and row.claimed_at is None and row.published_at is None

    def test_defaults(self, db: Engine) -> None:
        """Defaults: queue 'default', 3 attempts, run now, idempotency key unique per message."""
        before = dt.datetime.now(dt.timezone.utc)
        with Session(db) as session:
            first = outbox.enqueue(session, "a")
            second = outbox.enqueue(session, "a")
            session.commit()
        assert first.queue == "default" and first.max_attempts == 3 and first.input is None
        assert first.idempotency_key != second.idempotency_key
        assert before <= first.run_at <= dt.datetime.now(dt.timezone.utc)
        assert [r.idempotency_key for r in rows(db)] == [str(first.id), str(second.id)]

    def test_job_handle_supplies_name_queue_and_attempts(self, db: Engine) -> None:
        """A job handle's .name, .queue and .max_attempts are used; call arguments win."""

        class Handle:
            name = "charge_card"
            queue = "payments"
            max_attempts = 9

        with Session(db) as session:
            a = outbox.enqueue(session, Handle(), {"cents": 100})
            b = outbox.enqueue(session, Handle(), queue="urgent", max_attempts=1)
            session.commit()
        assert (a.job, a.queue, a.max_attempts) == ("charge_card", "payments", 9)
        assert (b.queue, b.max_attempts) == ("urgent", 1)

    def test_timedelta_run_at(self, db: Engine) -> None:
        """run_at may be a timedelta from now."""
        with Session(db) as session:
            message = outbox.enqueue(session, "later", run_at=dt.timedelta(hours=1))
            session.commit()
        assert message.run_at - message.staged_at > dt.timedelta(minutes=59)


class TestRollback:
    def test_rollback_leaves_nothing_and_session_is_reusable(self, db: Engine) -> None:
        """A rollback drops the staged messages; the same session then commits normally."""
        with Session(db) as session:
            session.add(Order(sku="R1"))
            outbox.enqueue(session, "gone")
            session.rollback()
            assert outbox.staged(session) == ()
            outbox.enqueue(session, "kept")
            session.commit()
        assert jobs(db) == ["kept"]

    def test_close_without_commit_leaves_nothing(self, db: Engine) -> None:
        """Closing a session that staged messages without committing writes nothing."""
        session = Session(db)
        outbox.enqueue(session, "never")
        session.close()
        assert outbox.staged(session) == ()
        outbox.enqueue(session, "after-close")
        session.commit()
        session.close()
        assert jobs(db) == ["after-close"]

    def test_commit_whose_flush_fails_leaves_nothing(self, db: Engine) -> None:
        """A commit whose flush raises IntegrityError writes no outbox row and keeps none staged."""
        with Session(db) as session:
            session.add(Order(id=1, sku="dup"))
            session.commit()
            session.add(Order(id=2, sku="dup"))  # unique violation at the final flush
            outbox.enqueue(session, "for-dup")
            with pytest.raises(IntegrityError):
                session.commit()
            assert outbox.staged(session) == ()
            session.rollback()
            assert outbox.staged(session) == ()
            session.add(Order(id=3, sku="ok"))
            outbox.enqueue(session, "for-ok")
            session.commit()
        assert jobs(db) == ["for-ok"]

    def test_context_manager_rollback_on_exception(self, db: Engine) -> None:
        """`with session.begin():` that raises publishes nothing staged inside it."""
        factory = sessionmaker(db)
        with pytest.raises(RuntimeError), factory.begin() as session:
            outbox.enqueue(session, "aborted")
            raise RuntimeError("business logic failed")
        with factory.begin() as session:
            outbox.enqueue(session, "committed")
        assert jobs(db) == ["committed"]


class TestSavepoints:
    def test_savepoint_matrix(self, db: Engine) -> None:
        """a; rolled-back b; released c; d released into an outer savepoint that rolls back; e.

        Only a, c and e are written.
        """
        with Session(db) as session:
            outbox.enqueue(session, "a")
            with pytest.raises(RuntimeError), session.begin_nested():
                outbox.enqueue(session, "b")
                raise RuntimeError("undo b")
            with session.begin_nested():
                outbox.enqueue(session, "c")
            outer = session.begin_nested()
            with session.begin_nested():
                outbox.enqueue(session, "d")
            assert [m.job for m in outbox.staged(session)] == ["a", "c", "d"]
            outer.rollback()
            outbox.enqueue(session, "e")
            assert [m.job for m in outbox.staged(session)] == ["a", "c", "e"]
            session.commit()
        assert jobs(db) == ["a", "c", "e"]

    def test_release_does_not_insert(self, db: Engine) -> None:
        """Releasing a savepoint writes nothing; the root commit writes everything at once."""
        statements = _count_outbox_inserts(db)
        with Session(db) as session:
            outbox.enqueue(session, "a")
            with session.begin_nested():
                outbox.enqueue(session, "b")
            assert statements == []
            session.commit()
        assert len(statements) == 1
        assert jobs(db) == ["a", "b"]

    def test_root_commit_with_savepoint_still_open(self, db: Engine) -> None:
        """Committing the root with a savepoint still open keeps messages inside and outside it."""
        factory = sessionmaker(db)
        with factory.begin() as session:
            outbox.enqueue(session, "outside")
            session.begin_nested()
            outbox.enqueue(session, "inside")
        assert jobs(db) == ["outside", "inside"]

    def test_session_commit_with_nested_savepoints_open(self, db: Engine) -> None:
        """session.commit() with two savepoints open commits every staged message."""
        with Session(db) as session:
            outbox.enqueue(session, "root")
            session.begin_nested()
            outbox.enqueue(session, "sp1")
            session.begin_nested()
            outbox.enqueue(session, "sp2")
            session.commit()
        assert jobs(db) == ["root", "sp1", "sp2"]

    def test_savepoint_whose_flush_fails_is_dropped(self, db: Engine) -> None:
        """A savepoint whose flush fails drops its messages; the outer transaction commits."""
        with Session(db) as session:
            session.add(Order(id=1, sku="x"))
            outbox.enqueue(session, "outer")
            try:
                with session.begin_nested():
                    session.add(Order(id=2, sku="x"))
                    outbox.enqueue(session, "inner")
            except IntegrityError:
                pass
            session.commit()
        assert jobs(db) == ["outer"]


def _count_outbox_inserts(engine: Engine) -> list[str]:
    statements: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO OUTBOX"):
            statements.append(statement)

    return statements


class TestBatching:
    def test_thousand_enqueues_are_one_insert_in_enqueue_order(self, db: Engine) -> None:
        """1,000 enqueues in one transaction: one INSERT, and claim order equals enqueue order."""
        statements = _count_outbox_inserts(db)
        with Session(db) as session:
            staged = [outbox.enqueue(session, "bulk", {"n": n}) for n in range(1000)]
            session.commit()
        assert len(statements) == 1
        stored = rows(db)
        assert [row.input["n"] for row in stored] == list(range(1000))
        assert [row.id for row in stored] == [m.id for m in staged]
        assert len({row.staged_at for row in stored}) == 1  # one timestamp: the id orders them

    def test_later_transaction_claims_later(self, db: Engine) -> None:
        """Across transactions, claim order is staging order."""
        with Session(db) as session:
            outbox.enqueue(session, "first")
            session.commit()
            outbox.enqueue(session, "second")
            session.commit()
        assert jobs(db) == ["first", "second"]


FLUSH_HOOKS = ["before_flush", "after_flush", "after_flush_postexec"]


def _enqueue_for_new_orders(hook: str) -> Any:
    """A flush hook that stages one `order_created` job per new Order: domain events."""

    def on_flush(session: Session, *_args: Any) -> None:
        # session.new still lists the flushed objects in after_flush; after_flush_postexec
        # sees them in the identity map.
        postexec = hook == "after_flush_postexec"
        objects = session.identity_map.values() if postexec else session.new
        for obj in list(objects):
            if isinstance(obj, Order) and obj.sku not in session.info.setdefault("seen", set()):
                session.info["seen"].add(obj.sku)
                outbox.enqueue(session, "order_created", {"sku": obj.sku})

    return on_flush


class TestEnqueueDuringCommit:
    """Everything staged before the COMMIT statement is written in that transaction."""

    @pytest.mark.parametrize("hook", FLUSH_HOOKS)
    def test_flush_hook_during_the_commits_own_flush_is_written(
        self, db: Engine, hook: str
    ) -> None:
        """A job staged by a flush hook of the flush that commit() runs itself (no explicit
        flush) commits with the order, in the same single INSERT as the jobs staged before."""
        statements = _count_outbox_inserts(db)
        factory = sessionmaker(db)
        event.listen(factory, hook, _enqueue_for_new_orders(hook))
        with factory() as session:
            outbox.enqueue(session, "before")
            order = Order(id=1, sku="A1")  # the identity map holds objects weakly
            session.add(order)
            session.commit()
            assert outbox.staged(session) == ()
        assert jobs(db) == ["before", "order_created"]
        assert [row.input for row in rows(db)][1] == {"sku": "A1"}
        assert len(statements) == 1

    @pytest.mark.parametrize("hook", FLUSH_HOOKS)
    def test_flush_hook_enqueues_follow_rollbacks_exactly(self, db: Engine, hook: str) -> None:
        """A rolled-back transaction drops its hook's job; a rolled-back savepoint drops the job
        staged by its own flush and keeps the one staged by the outer flush."""
        factory = sessionmaker(db)
        event.listen(factory, hook, _enqueue_for_new_orders(hook))
        with factory() as session:
            session.add(Order(id=1, sku="gone"))
            session.flush()
            session.rollback()
            assert outbox.staged(session) == ()
            session.info.pop("seen", None)
            kept = Order(id=2, sku="kept")  # the identity map holds objects weakly
            session.add(kept)
            with pytest.raises(RuntimeError), session.begin_nested():
                undone = Order(id=3, sku="undone")
                session.add(undone)
                session.flush()
                raise RuntimeError("undo the savepoint")
            session.commit()
        assert [row.input for row in rows(db)] == [{"sku": "kept"}]

    @pytest.mark.parametrize("position", ["before_ours", "after_ours", "on_the_session"])
    def test_application_before_commit_listener_is_written(self, db: Engine, position: str) -> None:
        """An app's own before_commit listener may enqueue, whether it was registered on the
        Session class before or after the library's, or on one session."""

        def audit(session: Session) -> None:
            if session.get_nested_transaction() is None and not session.info.get("audited"):
                session.info["audited"] = True
                outbox.enqueue(session, "audit")

        target: Any = Session
        session = Session(db)
        if position == "on_the_session":
            target = session
        event.listen(target, "before_commit", audit, insert=position == "before_ours")
        try:
            session.add(Order(id=1, sku="B1"))
            session.commit()
        finally:
            event.remove(target, "before_commit", audit)
            session.close()
        assert jobs(db) == ["audit"]

    def test_enqueue_after_commit_raises_instead_of_dropping(self, db: Engine) -> None:
        """From after_commit it is too late to write: enqueue raises StagingError naming the
        fix, and the transaction that had already committed is unaffected."""
        errors: list[BaseException] = []

        def late(session: Session) -> None:
            try:
                outbox.enqueue(session, "too-late")
            except outbox.StagingError as error:
                errors.append(error)

        session = Session(db)
        event.listen(session, "after_commit", late)
        outbox.enqueue(session, "on-time")
        session.commit()
        session.close()
        [error] = errors
        assert "Enqueue before commit()" in str(error)
        assert jobs(db) == ["on-time"]

    def test_enqueue_after_a_failed_flush_raises(self, db: Engine) -> None:
        """A session whose flush failed needs rollback(); enqueue says so instead of staging
        a job that could never commit."""
        with Session(db) as session:
            session.add(Order(id=1, sku="dup"))
            session.add(Order(id=2, sku="dup"))
            with pytest.raises(IntegrityError):
                session.flush()
            with pytest.raises(outbox.StagingError, match="rollback"):
                outbox.enqueue(session, "never")
            session.rollback()
            outbox.enqueue(session, "after-rollback")
            session.commit()
        assert jobs(db) == ["after-rollback"]


class TestExternalTransaction:
    """A session joined to a connection's transaction (the test-suite pattern)."""

    @pytest.mark.parametrize("mode", ["conditional_savepoint", "create_savepoint"])
    def test_written_with_the_external_transaction(self, db: Engine, mode: Any) -> None:
        """session.commit() inside an external transaction writes nothing by itself; the
        messages commit when the external transaction commits and vanish when it rolls back."""
        with db.connect() as conn:
            conn.begin()
            with Session(bind=conn, join_transaction_mode=mode) as session:
                outbox.enqueue(session, "rolled-back-outside")
                session.commit()
            conn.rollback()
            conn.begin()
            with Session(bind=conn, join_transaction_mode=mode) as session:
                outbox.enqueue(session, "committed-outside")
                session.commit()
            with Session(bind=conn, join_transaction_mode=mode) as session:
                outbox.enqueue(session, "closed-without-commit")
            conn.commit()
        assert jobs(db) == ["committed-outside"]


def test_two_phase_session_writes_before_prepare(pg_engine: Engine) -> None:
    """With twophase=True the rows go in before PREPARE TRANSACTION, not after it.

    This server runs with max_prepared_transactions = 0, so PREPARE itself fails; what is
    pinned is that the outbox INSERT was sent in the transaction before it (a two-phase commit
    fires no plain ``commit`` event, so without the prepare hook nothing would be sent at all).
    """
    statements: list[str] = []

    @event.listens_for(pg_engine, "before_cursor_execute")
    def _record(_c: Any, _cur: Any, statement: str, *_args: Any) -> None:
        statements.append(statement.split(maxsplit=1)[0].upper())

    with Session(pg_engine, twophase=True) as session:
        outbox.enqueue(session, "two-phase")
        with pytest.raises(DBAPIError):  # PREPARE refused, then psycopg refuses the rollback
            session.commit()
    assert statements == ["INSERT"]
    assert jobs(pg_engine) == []


class TestInputChecks:
    @pytest.mark.parametrize(
        ("payload", "needle"),
        [
            ({"total": Decimal("1.10")}, "Decimal('1.10') at input['total']"),
            ([1, {2, 3}], "at input[1]"),
            ({"x": float("nan")}, "nan at input['x']"),
            ({1: "a"}, "key 1"),
            (object(), "at input"),
        ],
    )
    def test_non_json_input_raises_type_error_at_enqueue(
        self, db: Engine, payload: Any, needle: str
    ) -> None:
        """Non-JSON input raises TypeError naming job and value; other staged rows still commit."""
        with Session(db) as session:
            outbox.enqueue(session, "good")
            with pytest.raises(TypeError, match="send_receipt") as info:
                outbox.enqueue(session, "send_receipt", payload)
            assert needle in str(info.value)
            assert [m.job for m in outbox.staged(session)] == ["good"]
            session.commit()
        assert jobs(db) == ["good"]

    @pytest.mark.parametrize(
        ("kwargs", "error", "needle"),
        [
            ({"job": ""}, ValueError, "non-empty"),
            ({"job": 42}, TypeError, "job name"),
            ({"run_at": dt.datetime(2030, 1, 1)}, ValueError, "timezone-aware"),
            ({"run_at": "tomorrow"}, TypeError, "timedelta"),
            ({"queue": 5}, TypeError, "queue"),
            ({"max_attempts": 0}, ValueError, "at least 1"),
            ({"max_attempts": True}, TypeError, "max_attempts"),
            ({"traceparent": "nope"}, ValueError, "W3C"),
            ({"idempotency_key": "k" * 300}, ValueError, "255"),
        ],
    )
    def test_bad_arguments_raise_at_the_call_and_stage_nothing(
        self, db: Engine, kwargs: dict[str, Any], error: type[Exception], needle: str
    ) -> None:
        """Every argument is checked at enqueue; a refused call stages nothing."""
        kwargs = dict(kwargs)
        job = kwargs.pop("job", "job")
        with Session(db) as session:
            with pytest.raises(error, match=needle) as info:
                outbox.enqueue(session, job, **kwargs)
            assert isinstance(info.value, outbox.OutboxError)
            assert outbox.staged(session) == ()
            assert not session.in_transaction()

    def test_not_a_session(self) -> None:
        """Passing something that is not a session is a TypeError that says what is accepted."""
        with pytest.raises(TypeError, match="Session, AsyncSession"):
            outbox.enqueue("session", "job")


class TestSessionKinds:
    def test_scoped_session(self, db: Engine) -> None:
        """A scoped_session stages into its current session."""
        registry = scoped_session(sessionmaker(db))
        outbox.enqueue(registry, "scoped")
        assert [m.job for m in outbox.staged(registry)] == ["scoped"]
        registry.commit()
        registry.remove()
        assert jobs(db) == ["scoped"]

    def test_core_connection_inserts_on_its_transaction(self, db: Engine) -> None:
        """On a Core Connection the row is written at once, inside the connection's transaction."""
        with db.connect() as conn:
            outbox.enqueue(conn, "core-rolled-back")
            conn.rollback()
            outbox.enqueue(conn, "core-committed")
            conn.commit()
        assert jobs(db) == ["core-committed"]

    def test_autobegin_disabled(self, db: Engine) -> None:
        """A session with autobegin=False and no transaction is told to call begin()."""
        with Session(db, autobegin=False) as session:
            with pytest.raises(outbox.StagingError, match=r"session\.begin\(\)"):
                outbox.enqueue(session, "x")
            session.begin()
            outbox.enqueue(session, "x")
            session.commit()
        assert jobs(db) == ["x"]

    def test_missing_table_names_the_fix(self, db: Engine) -> None:
        """Committing into a database without the outbox table names the migration to run, and
        the connection goes back to the pool usable (its failed transaction rolled back)."""
        outbox.metadata.drop_all(db)
        with Session(db) as session:
            outbox.enqueue(session, "x")
            with pytest.raises(outbox.MissingTableError, match="alembic upgrade head"):
                session.commit()
        for _ in range(3):  # whichever pooled connection comes back
            with db.connect() as conn:
                assert conn.execute(text("SELECT 1")).scalar() == 1


@pytest.fixture
def span() -> Iterator[str]:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("request") as current:
        context = current.get_span_context()
        yield f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def test_traceparent_defaults_to_current_span(db: Engine, span: str) -> None:
    """Inside a recording OpenTelemetry span, traceparent is that span's W3C header."""
    with Session(db) as session:
        message = outbox.enqueue(session, "traced")
        session.commit()
    assert message.traceparent == span
    assert rows(db)[0].traceparent == span


def test_no_traceparent_outside_a_span(db: Engine) -> None:
    """Outside any span no traceparent is invented."""
    with Session(db) as session:
        assert outbox.enqueue(session, "untraced").traceparent is None


def test_the_insert_is_one_execute_that_cursor_events_see(db: Engine) -> None:
    """The INSERT goes through the session's connection like any statement: SQL logging and
    tracing instrumentation (cursor events) see it, as one execute for one message."""
    seen: list[tuple[str, bool]] = []

    @event.listens_for(db, "before_cursor_execute")
    def _record(_c: Any, _cur: Any, statement: str, _p: Any, _ctx: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO OUTBOX"):
            seen.append((statement, many))

    with Session(db) as session:
        outbox.enqueue(session, "one", {"n": 1})
        session.commit()
    [(_statement, many)] = seen
    assert not many
    assert [row.input for row in rows(db)] == [{"n": 1}]


def test_input_none_is_json_null_not_sql_null(pg_engine: Engine) -> None:
    """No input is stored as the JSON value null, as SQLAlchemy's JSONB type stores None."""
    with Session(pg_engine) as session:
        message = outbox.enqueue(session, "no-input")
        session.commit()
    with pg_engine.connect() as conn:
        stored = conn.execute(
            text("SELECT input IS NULL, jsonb_typeof(input) FROM outbox WHERE id = :id"),
            {"id": message.id},
        ).one()
    assert tuple(stored) == (False, "null")


def test_schema_translate_map_is_honoured(pg_engine: Engine) -> None:
    """Under a schema_translate_map, enqueue and relay use the translated table (no SQL
    compiled in advance names the untranslated one)."""
    with pg_engine.begin() as conn:
        conn.execute(text("CREATE SCHEMA tenant_a"))
    tenant = pg_engine.execution_options(schema_translate_map={None: "tenant_a"})
    outbox.metadata.create_all(tenant)
    with Session(tenant) as session:
        message = outbox.enqueue(session, "tenant-job")
        session.commit()
    with pg_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tenant_a.outbox")).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM public.outbox")).scalar() == 0
    published: list[outbox.OutboxMessage] = []
    with outbox.Relay(tenant, published.append) as relay:
        assert relay.drain().published == 1
    assert [m.id for m in published] == [message.id]
    with pg_engine.connect() as conn:
        query = "SELECT count(*) FROM tenant_a.outbox WHERE published_at IS NOT NULL"
        assert conn.execute(text(query)).scalar() == 1
