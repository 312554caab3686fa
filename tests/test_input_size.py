"""An input too large for the database, the broker or a relay's memory is refused at the
``enqueue`` call, with the sizes and the fix; the business transaction goes on and commits."""

from __future__ import annotations

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, func, insert, select
from sqlalchemy.orm import Session

import sqla_outbox as outbox
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError
from sqla_outbox.input_size import (
    DEFAULT_MAX_INPUT_BYTES,
    MAX_INPUT_BYTES_OPTION,
    POSTGRESQL_JSONB_LIMIT,
    max_input_bytes,
)

orders = Table("orders", MetaData(), Column("id", Integer, primary_key=True))


def _count(engine: Engine, table: Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _order_with(engine: Engine, *inputs: object) -> list[BaseException]:
    """One business transaction: an order and one enqueue per input; the refusals it met."""
    orders.create(engine, checkfirst=True)
    refused: list[BaseException] = []
    with Session(engine) as session:
        session.execute(insert(orders).values(id=1))
        for value in inputs:
            try:
                outbox.enqueue(session, "send_receipt", value)
            except ConfigurationError as error:
                refused.append(error)
        session.commit()
    return refused


@pytest.fixture(params=["sqlite_engine", "mariadb_engine"])
def db(request: pytest.FixtureRequest) -> Engine:
    engine: Engine = request.getfixturevalue(request.param)
    return engine


def test_over_the_default_cap_is_refused_and_the_order_commits(db: Engine) -> None:
    """A 20 MB input (MariaDB's 16 MB packet would drop the connection at COMMIT and lose the
    order) is refused at the call, naming its size, the cap and the fix; an input just under the
    cap, full of quotes the MySQL driver escapes, commits with the order."""
    big = {"blob": "x" * (20 * 1024 * 1024)}
    quotes = '"' * (DEFAULT_MAX_INPUT_BYTES // 4 - 100)  # 4 bytes each on MariaDB, 2 elsewhere
    [refusal] = _order_with(db, big, {"q": quotes})
    text = str(refusal)
    assert "input for job 'send_receipt' is 20,971,5" in text
    assert f"over the {DEFAULT_MAX_INPUT_BYTES:,} bytes enqueue accepts" in text
    assert f"engine.execution_options({MAX_INPUT_BYTES_OPTION}=N)" in text
    assert _count(db, orders) == 1
    assert _count(db, outbox.OutboxRow.__table__) == 1


def test_the_cap_is_the_engines_execution_option(sqlite_engine: Engine) -> None:
    """A smaller cap set on the engine applies to sessions and to Core connections alike; the
    size counts UTF-8 bytes, not characters."""
    engine = sqlite_engine.execution_options(**{MAX_INPUT_BYTES_OPTION: 100})
    refused = _order_with(engine, {"t": "é" * 60}, {"t": "e" * 60})
    assert len(refused) == 1 and "is 129 bytes as stored JSON" in str(refused[0])
    with engine.begin() as conn, pytest.raises(ConfigurationError, match="over the 100 bytes"):
        outbox.enqueue(conn, "job", {"t": "x" * 200})


def test_a_cap_above_what_jsonb_holds_is_lowered_to_it() -> None:
    options = {MAX_INPUT_BYTES_OPTION: 10**12}
    assert max_input_bytes(options, "postgresql") == POSTGRESQL_JSONB_LIMIT
    assert max_input_bytes(options, "sqlite") == 10**12
    assert max_input_bytes({}, "mysql") == DEFAULT_MAX_INPUT_BYTES


@pytest.mark.parametrize("cap", [0, -1, 1.5, "4MB", True])
def test_a_bad_cap_is_refused_with_an_example(cap: object) -> None:
    with pytest.raises(ArgumentTypeError, match="must be a positive int"):
        max_input_bytes({MAX_INPUT_BYTES_OPTION: cap}, "sqlite")
