"""The relay's numbered driver SQL on a real psycopg connection (``driver_sql.execute``).

The statement goes through a ``RawCursor`` for one execute: the connection must come back as
it was (a ``%(name)s`` statement after it still runs), also when the statement fails, and the
UUID arrays must arrive as UUIDs.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from psycopg import pq
from psycopg.adapt import PyFormat
from sqlalchemy import Engine, Uuid, bindparam, cast, event, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

import sqla_outbox as outbox
from sqla_outbox import driver_sql


def test_numbered_sql_runs_and_leaves_the_connection_as_it_was(pg_engine: Engine) -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    statement = driver_sql.precompile(
        select(func.cardinality(bindparam("ids", type_=ARRAY(Uuid()))), bindparam("n") + 1),
        pg_engine.dialect,
    )
    assert "ids" in statement.binary
    with pg_engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        factory = driver.cursor_factory
        rows = driver_sql.execute(conn, statement, {"ids": ids, "n": 41}).all()
        assert rows == [(3, 42)]
        assert driver.cursor_factory is factory
        assert conn.execute(text("SELECT :x"), {"x": "named again"}).scalar() == "named again"


def test_a_failing_numbered_statement_restores_the_cursor_factory(pg_engine: Engine) -> None:
    statement = driver_sql.precompile(select(cast(bindparam("n"), Uuid())), pg_engine.dialect)
    with pg_engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        factory = driver.cursor_factory
        with pytest.raises(DBAPIError, match="uuid"):
            driver_sql.execute(conn, statement, {"n": "not a uuid"})
        assert driver.cursor_factory is factory
        conn.rollback()
        assert conn.execute(text("SELECT :x"), {"x": 1}).scalar() == 1


def test_uuid_arrays_travel_binary_and_arrive_intact(pg_engine: Engine) -> None:
    """A ``RawCursor`` has no ``%b``: the array is wrapped in a type whose dumper, registered on
    the connection, is psycopg's binary list dumper (its text format quotes every element
    through a regular expression, 1.2 ms for a 1,000-row claim's ids)."""
    ids = [uuid.uuid4(), uuid.uuid4()]
    statement = driver_sql.precompile(
        select(bindparam("ids", type_=ARRAY(Uuid()))), pg_engine.dialect
    )
    with pg_engine.connect() as conn:
        row = driver_sql.execute(conn, statement, {"ids": ids}).one()
        assert row[0] == ids
        driver = conn.connection.driver_connection
        assert driver is not None
        dumper = driver.adapters.get_dumper(driver_sql._BinaryArray, PyFormat.AUTO)
        assert dumper.format == pq.Format.BINARY


def test_the_relay_cursor_decodes_jsonb_with_the_connections_own_loads(pg_engine: Engine) -> None:
    """The relay's cursor tolerates ``input`` Python cannot decode by wrapping the loader the
    connection has, so a ``set_json_loads`` of the application's still decodes its claims."""
    from psycopg.types.json import set_json_loads  # noqa: PLC0415 - this test's driver

    @event.listens_for(pg_engine, "connect")
    def _custom_loads(dbapi_connection: Any, _record: Any) -> None:
        set_json_loads(
            lambda data: {"decoded by": "the application", **json.loads(data)}, dbapi_connection
        )

    pg_engine.dispose()
    with Session(pg_engine) as session:
        outbox.enqueue(session, "send_receipt", {"order_id": 7})
        session.commit()
    inputs: list[Any] = []
    with outbox.Relay(pg_engine, lambda message: inputs.append(message.input)) as relay:
        relay.drain()
    assert inputs == [{"decoded by": "the application", "order_id": 7}]
