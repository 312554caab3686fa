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


def test_a_tolerant_claim_decodes_jsonb_with_the_connections_own_loads(pg_engine: Engine) -> None:
    """Once a claim met ``jsonb`` Python cannot decode (nested past the recursion limit), the
    relay's claims decode tolerantly by wrapping the loader the connection has: a
    ``set_json_loads`` of the application's still decodes every other row, and the deep one
    is charged instead of failing the claim."""
    from psycopg.types.json import set_json_loads  # noqa: PLC0415 - this test's driver

    @event.listens_for(pg_engine, "connect")
    def _custom_loads(dbapi_connection: Any, _record: Any) -> None:
        set_json_loads(
            lambda data: {"decoded by": "the application", **json.loads(data)}, dbapi_connection
        )

    pg_engine.dispose()
    for order_id in (1, 2):
        with Session(pg_engine) as session:
            outbox.enqueue(session, "send_receipt", {"order_id": order_id})
            session.commit()
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE outbox SET input = (repeat('[', 3000) || repeat(']', 3000))::jsonb "
            "WHERE input->>'order_id' = '1'"
        )
    inputs: list[Any] = []
    with outbox.Relay(pg_engine, lambda message: inputs.append(message.input)) as relay:
        result = relay.drain()
    assert inputs == [{"decoded by": "the application", "order_id": 2}]
    assert (result.published, result.failed) == (1, True)
