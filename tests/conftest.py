"""Shared fixtures: a fresh PostgreSQL or MariaDB database per test, SQLite files, and relays
torn down.

PostgreSQL comes from pytest-postgresql. As root ``initdb`` cannot run, so by default the
fixtures use the server already running (``postgresql_noproc``); host, port, user and password
come from ``SQLA_OUTBOX_PG_HOST``/``_PORT``/``_USER``/``_PASSWORD``. A non-root user with no
server configured gets a throwaway one from ``postgresql_proc``. Each test receives its own
database, created and dropped by pytest-postgresql; a test that needs PostgreSQL is skipped with
the reason when the server cannot be reached.

MariaDB (or MySQL) is the server on ``SQLA_OUTBOX_MYSQL_HOST``/``_PORT``/``_USER``/``_PASSWORD``
(default ``root`` at 127.0.0.1:3306, no password), reached through PyMySQL (the ``mysql``
extra). Each test that asks for it gets its own database, created here and dropped after it; a
test is skipped with the reason when PyMySQL is not installed or the server cannot be reached.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pytest_postgresql import factories
from sqlalchemy import Engine
from sqlalchemy.engine import URL
from support import MakeRelay

import sqla_outbox as outbox
from sqla_outbox.engines import create_engine

PG_HOST = os.environ.get("SQLA_OUTBOX_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("SQLA_OUTBOX_PG_PORT", "5432"))
PG_USER = os.environ.get("SQLA_OUTBOX_PG_USER", "postgres")
PG_PASSWORD = os.environ.get("SQLA_OUTBOX_PG_PASSWORD", "")
USE_RUNNING_SERVER = os.geteuid() == 0 or "SQLA_OUTBOX_PG_HOST" in os.environ

if USE_RUNNING_SERVER:
    postgresql_server = factories.postgresql_noproc(
        host=PG_HOST,
        port=PG_PORT,
        user=PG_USER,
        password=PG_PASSWORD,
        # Per process, so two test runs against one server never share a template database.
        dbname=f"sqla_outbox_test_{os.getpid()}",
    )
else:  # pragma: no cover - only for non-root developers without a server
    postgresql_server = factories.postgresql_proc()

postgresql = factories.postgresql("postgresql_server")


@pytest.fixture(scope="session")
def _pg_reachable() -> None:
    if not USE_RUNNING_SERVER:
        return
    try:
        psycopg.connect(
            host=PG_HOST,
            port=PG_PORT,
            user=PG_USER,
            password=PG_PASSWORD,
            dbname="postgres",
            connect_timeout=3,
        ).close()
    except psycopg.OperationalError as exc:
        pytest.skip(
            f"PostgreSQL is not reachable at {PG_HOST}:{PG_PORT} as {PG_USER!r} ({exc}); "
            "start it (pg_ctlcluster 15 main start) or set SQLA_OUTBOX_PG_HOST/_PORT/_USER"
        )


@pytest.fixture
def pg_url(_pg_reachable: None, request: pytest.FixtureRequest) -> URL:
    """URL of a fresh, empty PostgreSQL database for this test (psycopg 3 driver)."""
    conn: psycopg.Connection[object] = request.getfixturevalue("postgresql")
    info = conn.info
    return URL.create(
        "postgresql+psycopg",
        username=info.user,
        password=info.password or None,
        host=info.host,
        port=info.port,
        database=info.dbname,
    )


def _with_outbox(url: URL) -> Iterator[Engine]:
    """An engine on ``url`` with the outbox table created, disposed of afterwards."""
    engine = create_engine(url)
    outbox.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def pg_engine(pg_url: URL) -> Iterator[Engine]:
    """An engine on a fresh PostgreSQL database that already has the outbox table."""
    yield from _with_outbox(pg_url)


MYSQL_HOST = os.environ.get("SQLA_OUTBOX_MYSQL_HOST", "127.0.0.1")
MYSQL_PORT = int(os.environ.get("SQLA_OUTBOX_MYSQL_PORT", "3306"))
MYSQL_USER = os.environ.get("SQLA_OUTBOX_MYSQL_USER", "root")
MYSQL_PASSWORD = os.environ.get("SQLA_OUTBOX_MYSQL_PASSWORD", "")
_mysql_databases = itertools.count()


def _mysql_admin(**kwargs: Any) -> Any:
    """A PyMySQL connection to the server itself (no database), in autocommit."""
    import pymysql  # noqa: PLC0415 - optional: only the MySQL/MariaDB tests need it

    return pymysql.connect(
        host=MYSQL_HOST,
        port=MYSQL_PORT,
        user=MYSQL_USER,
        password=MYSQL_PASSWORD,
        autocommit=True,
        **kwargs,
    )


@pytest.fixture(scope="session")
def _mariadb_reachable() -> None:
    try:
        import pymysql  # noqa: PLC0415 - optional: only the MySQL/MariaDB tests need it
    except ImportError:
        pytest.skip("PyMySQL is not installed; pip install -e '.[mysql]' to run the MySQL tests")
    try:
        _mysql_admin(connect_timeout=3).close()
    except pymysql.MySQLError as exc:
        pytest.skip(
            f"MariaDB/MySQL is not reachable at {MYSQL_HOST}:{MYSQL_PORT} as {MYSQL_USER!r} "
            f"({exc}); start it (service mariadb start) or set SQLA_OUTBOX_MYSQL_HOST/_PORT/_USER"
        )


@pytest.fixture
def mariadb_url(_mariadb_reachable: None) -> Iterator[URL]:
    """URL of a fresh, empty MariaDB/MySQL database for this test (PyMySQL, utf8mb4), dropped
    after it. Dispose of engines on it before the test ends: an open transaction would hold
    the drop up (for at most ``lock_wait_timeout``, set short here)."""
    name = f"sqla_outbox_test_{os.getpid()}_{next(_mysql_databases)}"
    admin = _mysql_admin()
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        yield URL.create(
            "mysql+pymysql",
            username=MYSQL_USER,
            password=MYSQL_PASSWORD or None,
            host=MYSQL_HOST,
            port=MYSQL_PORT,
            database=name,
            query={"charset": "utf8mb4"},
        )
        with admin.cursor() as cursor:
            cursor.execute("SET SESSION lock_wait_timeout = 10")
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        admin.close()


@pytest.fixture
def mariadb_engine(mariadb_url: URL) -> Iterator[Engine]:
    """An engine on a fresh MariaDB/MySQL database that already has the outbox table."""
    yield from _with_outbox(mariadb_url)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> URL:
    """URL of a fresh SQLite file for this test."""
    return URL.create("sqlite+pysqlite", database=str(tmp_path / "outbox.sqlite3"))


@pytest.fixture
def sqlite_engine(sqlite_url: URL) -> Iterator[Engine]:
    """An SQLite engine with real transactions and the outbox table."""
    engine = create_engine(sqlite_url)
    outbox.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def engine(request: pytest.FixtureRequest) -> Engine:
    """The same test on PostgreSQL and on SQLite."""
    name = "pg_engine" if request.param == "postgresql" else "sqlite_engine"
    result: Engine = request.getfixturevalue(name)
    return result


@pytest.fixture
def make_relay() -> Iterator[MakeRelay]:
    """Build relays that are stopped and closed (closing their publishers) when the test ends,
    whatever happened."""
    made: list[outbox.Relay] = []

    def make(*args: Any, **kwargs: Any) -> outbox.Relay:
        relay = outbox.Relay(*args, **kwargs)
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.stop()
        relay.close()  # stop() closes only a relay that was started; close() is idempotent
