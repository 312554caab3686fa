"""The stores: one engine fixture, ``store_engine``, parametrised over every database the relay
runs on, each through the driver that selects its store.

* ``pg-psycopg``: PostgreSQL through psycopg 3, the store with the driver-SQL fast path
  (``tests/conftest.py``'s ``pg_engine``).
* ``pg-core``: the same database through psycopg2, which the fast path does not apply to, so
  the relay runs the plain SQLAlchemy Core statements.
* ``sqlite``: an SQLite file (``sqlite_engine``); its relays serialise on the write lock.
* ``mariadb``: MariaDB (or MySQL) through PyMySQL (``mariadb_engine``).

Every engine comes with the outbox table. A store whose server is not reachable skips its tests
with the reason, as the fixtures it builds on do.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from sqla_outbox.engines import create_engine

STORES = {
    "pg-psycopg": "pg_engine",
    "pg-core": "pg_core_engine",
    "sqlite": "sqlite_engine",
    "mariadb": "mariadb_engine",
}
"""Store id (as the tests are named) -> the fixture that builds its engine."""


@pytest.fixture
def pg_core_engine(pg_engine: Engine) -> Iterator[Engine]:
    """``pg_engine``'s database (table included) through psycopg2: the Core path."""
    engine = create_engine(pg_engine.url.set(drivername="postgresql+psycopg2"))
    assert engine.dialect.driver == "psycopg2"
    yield engine
    engine.dispose()


@pytest.fixture(params=list(STORES))
def store_engine(request: pytest.FixtureRequest) -> Engine:
    """An engine on a fresh database of each store in turn, with the outbox table."""
    engine: Engine = request.getfixturevalue(STORES[request.param])
    return engine
