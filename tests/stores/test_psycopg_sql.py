"""The relay's numbered driver SQL on a real psycopg connection (``psycopg_sql.execute``).

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
from sqla_outbox.stores import psycopg_sql


def test_numbered_sql_runs_and_leaves_the_connection_as_it_was(pg_engine: Engine) -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    statement = psycopg_sql.precompile(
        select(func.cardinality(bindparam("ids", type_=ARRAY(Uuid()))), bindparam("n") + 1),
        pg_engine.dialect,
    )
    assert "ids" in statement.binary
    with pg_engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        factory = driver.cursor_factory
        rows = psycopg_sql.execute(conn, statement, {"ids": ids, "n": 41}).all()
        assert rows == [(3, 42)]
        assert driver.cursor_factory is factory
        assert conn.execute(text("SELECT :x"), {"x": "named again"}).scalar() == "named again"


def test_a_failing_numbered_statement_restores_the_cursor_factory(pg_engine: Engine) -> None:
    statement = psycopg_sql.precompile(select(cast(bindparam("n"), Uuid())), pg_engine.dialect)
    with pg_engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        factory = driver.cursor_factory
        with pytest.raises(DBAPIError, match="uuid"):
            psycopg_sql.execute(conn, statement, {"n": "not a uuid"})
        assert driver.cursor_factory is factory
        conn.rollback()
        assert conn.execute(text("SELECT :x"), {"x": 1}).scalar() == 1


def test_uuid_arrays_travel_binary_and_arrive_intact(pg_engine: Engine) -> None:
    """A ``RawCursor`` has no ``%b``: the array is wrapped in a type whose dumper, registered on
    the connection, is psycopg's binary list dumper (its text format quotes every element
    through a regular expression, 1.2 ms for a 1,000-row claim's ids)."""
    ids = [uuid.uuid4(), uuid.uuid4()]
    statement = psycopg_sql.precompile(
        select(bindparam("ids", type_=ARRAY(Uuid()))), pg_engine.dialect
    )
    with pg_engine.connect() as conn:
        row = psycopg_sql.execute(conn, statement, {"ids": ids}).one()
        assert row[0] == ids
        driver = conn.connection.driver_connection
        assert driver is not None
        dumper = driver.adapters.get_dumper(psycopg_sql._BinaryArray, PyFormat.AUTO)
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


_JSONB_VALUES = (
    '{"order_id": 7, "note": "caf\\u00e9 \\u2603 \\ud83d\\ude00 \\"quoted\\" \\\\ / \\t"}',
    '[1, -2.5, 1e-7, 12345678901234567890123, true, false, null, "x"]',
    '"a scalar string, \\u00fcber"',
    "3.14159265358979323846264338327950288",
    '{"nested": {"deeper": [{"deepest": {}}, []]}, "": "empty key"}',
    "null",
)


def test_relay_statements_decode_jsonb_exactly_as_the_connection_would(pg_engine: Engine) -> None:
    """The relay's cursor decodes ``jsonb`` without ``json.loads``' encoding detection (see
    ``psycopg_sql._jsonb_loader``): every value, non-ASCII and non-BMP text, huge integers and
    long decimals included, comes out equal and of the same types as through the connection's
    own loader, and the connection keeps that loader."""
    from psycopg.types.json import JsonbLoader  # noqa: PLC0415 - this test's driver

    selects = ", ".join(f"CAST(:v{n} AS jsonb)" for n in range(len(_JSONB_VALUES)))
    params = {f"v{n}": value for n, value in enumerate(_JSONB_VALUES)}
    statement = psycopg_sql.precompile(text(f"SELECT {selects}"), pg_engine.dialect)
    with pg_engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        jsonb = driver.adapters.types["jsonb"].oid
        before = driver.adapters.get_loader(jsonb, pq.Format.TEXT)
        assert before is JsonbLoader  # psycopg's own: the case the relay reads faster
        relay_row = psycopg_sql.execute(conn, statement, params).one()
        assert driver.adapters.get_loader(jsonb, pq.Format.TEXT) is before
        own_row = conn.execute(text(f"SELECT {selects}"), params).one()
    expected = [json.loads(value) for value in _JSONB_VALUES]
    assert list(relay_row) == list(own_row) == expected
    assert [_types(value) for value in relay_row] == [_types(value) for value in expected]


def _types(value: Any) -> Any:
    """``value``'s structure with each leaf replaced by its type."""
    if isinstance(value, dict):
        return {key: _types(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_types(item) for item in value]
    return type(value)


def test_a_relay_decodes_jsonb_with_a_loads_the_application_set(pg_engine: Engine) -> None:
    """The faster decoding is for psycopg's own ``json.loads`` only: a ``set_json_loads`` of the
    application's, on the connection or for the whole process (which psycopg sets on its loader
    class itself, after the relay has already decoded with the default), decodes every claim."""
    from psycopg.types.json import set_json_loads  # noqa: PLC0415 - this test's driver

    def by(whom: str) -> Any:
        return lambda data: {"decoded by": whom, **json.loads(data)}

    def drain(order_id: int) -> list[Any]:
        with Session(pg_engine) as session:
            outbox.enqueue(session, "send_receipt", {"order_id": order_id})
            session.commit()
        inputs: list[Any] = []
        with outbox.Relay(pg_engine, lambda message: inputs.append(message.input)) as relay:
            relay.drain()
        return inputs

    assert drain(1) == [{"order_id": 1}]
    try:
        set_json_loads(by("the process"))
        assert drain(2) == [{"decoded by": "the process", "order_id": 2}]

        @event.listens_for(pg_engine, "connect")
        def _custom_loads(dbapi_connection: Any, _record: Any) -> None:
            set_json_loads(by("the connection"), dbapi_connection)

        pg_engine.dispose()
        assert drain(3) == [{"decoded by": "the connection", "order_id": 3}]
    finally:
        set_json_loads(json.loads)
    pg_engine.dispose()
    event.remove(pg_engine, "connect", _custom_loads)
    assert drain(4) == [{"order_id": 4}]


def test_a_relay_compiles_each_statement_when_first_sent_and_once(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiling every statement a relay might send took 0.3-0.5 s of CPU at ``Relay(...)``;
    a relay alone never sends the claims for a crowded outbox, nor one without failures the
    settle. Building a relay compiles nothing; a drain compiles what it sends, each once."""
    compiled: list[str] = []
    precompile = psycopg_sql.precompile

    def counting(statement: Any, dialect: Any, *args: Any) -> psycopg_sql.Precompiled:
        result = precompile(statement, dialect, *args)
        if not result.sql.startswith("INSERT"):  # the staging INSERT: enqueue's, not the relay's
            compiled.append(result.sql)
        return result

    monkeypatch.setattr(psycopg_sql, "precompile", counting)
    with outbox.Relay(pg_engine, lambda message: None, batch_size=2) as relay:
        assert compiled == []
        for drain in range(2):
            for order_id in range(3):
                with Session(pg_engine) as session:
                    outbox.enqueue(session, "send_receipt", {"order_id": order_id})
                    session.commit()
            assert relay.drain().published == 3
            if drain == 0:
                after_first = list(compiled)
    assert compiled == after_first  # the second drain sent nothing new
    assert len(set(compiled)) == len(compiled)  # each compiled once
    # Of the ten it may send: the claim, the claim carrying a mark, the sweep. Not the claims
    # for a crowded outbox, the renewal, the settle or the mark on its own.
    assert len(compiled) == 3, [sql[:60] for sql in compiled]
