"""Shared fixtures: a fresh PostgreSQL or MariaDB database per test, SQLite files, and relays
torn down.

PostgreSQL comes from pytest-postgresql. As root ``initdb`` cannot run, so by default the
fixtures use the server already running (``postgresql_noproc``); host, port, user and password
come from ``SQLA_OUTBOX_PG_HOST``/``_PORT``/``_USER``/``_PASSWORD``. A non-root user with no
server configured gets a throwaway one from ``postgresql_proc``. Each test process (each
pytest-xdist worker) has one database, created by pytest-postgresql's janitor and dropped at the
end; every test that asks for PostgreSQL gets it emptied first: its other connections ended and
every schema dropped, ``public`` made again as a new database has it. Emptying takes a few
milliseconds where creating a database from a template takes a few hundred, which with over a
thousand PostgreSQL tests is most of a run. A test that needs PostgreSQL is skipped with the
reason when the server cannot be reached or pytest-postgresql is not installed.

MariaDB (or MySQL) is the server on ``SQLA_OUTBOX_MYSQL_HOST``/``_PORT``/``_USER``/``_PASSWORD``
(default ``root`` at 127.0.0.1:3306, no password), reached through PyMySQL (the ``mysql``
extra). Each test that asks for it gets its own database, created here and dropped after it; a
test is skipped with the reason when PyMySQL is not installed or the server cannot be reached.

Markers (``pyproject.toml``): tests that use a PostgreSQL or MariaDB fixture are marked ``db``
here, those under ``tests/brokers`` ``broker``; ``pytest -m "not db and not broker and not
slow"`` is the fast tier, which needs no service and not even the database test extras.
"""

from __future__ import annotations

import gc
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine
from sqlalchemy.engine import URL
from support import MakeRelay

import sqla_outbox as outbox
from sqla_outbox.engines import create_engine

try:
    from pytest_postgresql import factories
    from pytest_postgresql.janitor import DatabaseJanitor
except ImportError:  # the fast tier runs without the database test extras
    factories = None

PG_HOST = os.environ.get("SQLA_OUTBOX_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("SQLA_OUTBOX_PG_PORT", "5432"))
PG_USER = os.environ.get("SQLA_OUTBOX_PG_USER", "postgres")
PG_PASSWORD = os.environ.get("SQLA_OUTBOX_PG_PASSWORD", "")
USE_RUNNING_SERVER = os.geteuid() == 0 or "SQLA_OUTBOX_PG_HOST" in os.environ

if factories is not None:
    if USE_RUNNING_SERVER:
        postgresql_server = factories.postgresql_noproc(
            host=PG_HOST,
            port=PG_PORT,
            user=PG_USER,
            password=PG_PASSWORD,
            # Per process, so two test runs (or workers) never share a database.
            dbname=f"sqla_outbox_test_{os.getpid()}",
        )
    else:  # pragma: no cover - only for non-root developers without a server
        postgresql_server = factories.postgresql_proc()

DB_FIXTURES = frozenset(
    {"pg_url", "pg_engine", "pg_core_engine", "mariadb_url", "mariadb_engine", "_pg_database"}
)
"""Fixtures that need a database server: a test using one (directly or through another
fixture) is marked ``db``."""


DB_PARAMS = frozenset({"postgresql", "pg-psycopg", "pg-core", "mariadb", "mysql"})
"""Parameter values that run a test on a database server (``engine``, ``store_engine``, ...)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that need a server: ``db`` (PostgreSQL or MariaDB) and ``broker``."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        chosen = {value for value in params.values() if isinstance(value, str)}
        if names & DB_FIXTURES or chosen & (DB_FIXTURES | DB_PARAMS):
            item.add_marker(pytest.mark.db)
        if "brokers" in item.path.parts:
            item.add_marker(pytest.mark.broker)


@pytest.fixture(scope="session")
def _pg_reachable() -> None:
    if factories is None:
        pytest.skip(
            "pytest-postgresql is not installed; pip install -e '.[dev]' to run the PostgreSQL "
            "tests"
        )
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


@pytest.fixture(scope="session")
def _pg_database(_pg_reachable: None, request: pytest.FixtureRequest) -> Iterator[URL]:
    """This process's PostgreSQL database (see the module docs), dropped at the end."""
    server = request.getfixturevalue("postgresql_server")
    janitor = DatabaseJanitor(
        user=server.user,
        host=server.host,
        port=server.port,
        dbname=f"{server.dbname}_tests",
        maintenance_dbname=server.maintenance_dbname,
        password=server.password,
    )
    janitor.drop()  # left by a run that was killed
    janitor.init()
    url = URL.create(
        "postgresql+psycopg",
        username=server.user,
        password=server.password or None,
        host=server.host,
        port=server.port,
        database=f"{server.dbname}_tests",
    )
    yield url
    _end_other_connections(url)
    janitor.drop()


def _connect(url: URL, dbname: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host=url.host,
        port=url.port,
        user=url.username,
        password=url.password or "",
        dbname=dbname,
        autocommit=True,
    )


_END_OTHERS = (
    "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)
"""End every other connection to the connection's database, waiting (up to 10 s each) until
it is gone, so that nothing a previous test left holds a lock or shows in
``pg_stat_activity``."""


def _end_other_connections(url: URL) -> None:
    """:data:`_END_OTHERS` on ``url``'s database, before it is dropped."""
    with _connect(url, str(url.database)) as conn:
        conn.execute(_END_OTHERS)


def _empty(url: URL) -> None:
    """``url``'s database as a new one is: no other connection, no schema but an empty
    ``public`` (owned by ``pg_database_owner``, usable by every role, as PostgreSQL 15 makes
    it). One connection, three round trips: this runs before every PostgreSQL test."""
    with _connect(url, str(url.database)) as conn:
        conn.execute(_END_OTHERS)
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace "
            "WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'"
        ).fetchall()
        drop = sql.SQL("DROP SCHEMA {} CASCADE; ").format(
            sql.SQL(", ").join(sql.Identifier(schema) for (schema,) in schemas)
        )
        conn.execute(
            (drop if schemas else sql.SQL(""))
            + sql.SQL(
                "CREATE SCHEMA public AUTHORIZATION pg_database_owner; "
                "GRANT USAGE ON SCHEMA public TO PUBLIC"
            )
        )


@pytest.fixture
def pg_url(_pg_database: URL) -> URL:
    """URL of an empty PostgreSQL database for this test (psycopg 3 driver)."""
    _empty(_pg_database)
    return _pg_database


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


FIND_LEAKS = bool(os.environ.get("SQLA_OUTBOX_TEST_FIND_LEAKS"))
"""``SQLA_OUTBOX_TEST_FIND_LEAKS=1``: psycopg's warning for a connection left open is an error
again (``pyproject.toml`` ignores it by default, as it fails whichever test the garbage
collector happens to run in), and garbage is collected after each test, so a test that leaked
a connection fails itself."""


def pytest_configure(config: pytest.Config) -> None:
    if FIND_LEAKS:  # added last, so it takes precedence over the ignore in pyproject.toml
        config.addinivalue_line(
            "filterwarnings", "error:.*was deleted while still open.*:ResourceWarning"
        )


@pytest.fixture(autouse=True)
def _leaked_connections() -> Iterator[None]:
    """See :data:`FIND_LEAKS`."""
    yield
    if FIND_LEAKS:
        gc.collect()
