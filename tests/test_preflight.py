"""Start-up checks (``sqla_outbox.preflight``): what a user can get wrong is refused early.

A role without the privileges the relay needs, a database other than PostgreSQL, SQLite or
MySQL/MariaDB (and MySQL/MariaDB for a relay), a malformed URL, an ``AsyncEngine``: each is pinned
here through the real entry points
(``Relay(...)``, ``Relay.check()``, the console script as a subprocess) against real databases.
Roles are cluster-wide in PostgreSQL, so the ones these tests create are dropped at teardown.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import URL, Engine, select
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session
from support import MakeRelay, run_cli, stage_inputs

import sqla_outbox as outbox
from sqla_outbox.engines import create_engine
from sqla_outbox.errors import ConfigurationError, MissingPrivilegeError, MissingTableError

MakeRole = Callable[..., URL]


@pytest.fixture
def make_role(pg_engine: Engine) -> Iterator[MakeRole]:
    """``make_role(*privileges, name=None)``: a login role holding ``privileges`` on the outbox
    table of this test's database; returns a URL that connects as it. Dropped at teardown."""
    created: list[str] = []

    def make(*privileges: str, name: str | None = None, schema: str = "public") -> URL:
        role = name or f"app_ro_{uuid.uuid4().hex[:8]}"
        quoted = pg_engine.dialect.identifier_preparer.quote(role)
        with pg_engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE ROLE {quoted} LOGIN")
            created.append(quoted)
            if privileges:
                conn.exec_driver_sql(
                    f"GRANT {', '.join(privileges)} ON {schema}.outbox TO {quoted}"
                )
        return pg_engine.url.set(username=role, password=None)

    yield make
    with pg_engine.begin() as conn:
        for quoted in created:
            conn.exec_driver_sql(f"DROP OWNED BY {quoted}")
            conn.exec_driver_sql(f"DROP ROLE {quoted}")


def grant_from(message: str) -> str:
    """The GRANT statement(s) an error message tells the operator to run."""
    return message[message.index("GRANT") :].strip()


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one ``Error:`` line of a finished CLI run that failed cleanly."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    return line


def published(engine: Engine) -> int:
    with Session(engine) as session:
        stmt = select(sa.func.count()).where(outbox.OutboxRow.published_at.is_not(None))
        return int(session.scalar(stmt) or 0)


# --- privileges (PostgreSQL) -------------------------------------------------------------------


def test_relay_once_names_the_missing_update_privilege(
    pg_engine: Engine, make_role: MakeRole
) -> None:
    """`relay --once` as a role with SELECT and INSERT (an application's role) exits 1 with one
    sentence naming the role, exactly what it lacks (UPDATE), the table and the GRANT, publishes
    nothing; running that GRANT is enough for the next run to publish."""
    stage_inputs(pg_engine, "send_receipt", [{"n": 1}])
    url = make_role("SELECT", "INSERT")
    role = url.username

    result = run_cli("relay", "--once", url=url.render_as_string(False), publisher="stdout")

    assert result.returncode == 1
    assert error_line(result) == (
        f"Error: Role '{role}' lacks UPDATE on table 'public.outbox', which the relay needs. "
        f"Grant it: GRANT UPDATE ON public.outbox TO {role};"
    )
    assert result.stdout == ""
    assert published(pg_engine) == 0

    with pg_engine.begin() as conn:
        conn.exec_driver_sql(grant_from(error_line(result)))
    again = run_cli("relay", "--once", url=url.render_as_string(False), publisher="stdout")
    assert again.returncode == 0, again.stderr
    assert published(pg_engine) == 1


def test_a_relay_that_purges_needs_delete(pg_engine: Engine, make_role: MakeRole) -> None:
    """With retain_published the relay deletes old rows, so check() names DELETE and its GRANT
    (instead of a `relay.purge_failed` warning once a minute); without it, it does not ask."""
    url = make_role("SELECT", "UPDATE")
    engine = create_engine(url)
    try:
        outbox.Relay(engine, lambda message: None).check()
        purging = outbox.Relay(engine, lambda message: None, retain_published=dt.timedelta(days=7))
        with pytest.raises(MissingPrivilegeError) as caught:
            purging.check()
        assert str(caught.value) == (
            f"Role '{url.username}' lacks DELETE on table 'public.outbox', which the relay with "
            f"retain_published needs. Grant it: GRANT DELETE ON public.outbox TO {url.username};"
        )
    finally:
        engine.dispose()


def test_long_running_relay_fails_fast_on_missing_privileges(make_role: MakeRole) -> None:
    """Without --once the relay does not start its loop (which would log the same "permission
    denied" forever): it exits 1 at once with the privilege sentence."""
    url = make_role()

    result = run_cli("relay", url=url.render_as_string(False), publisher="stdout")

    assert result.returncode == 1
    line = error_line(result)
    assert "lacks SELECT and UPDATE on table 'public.outbox', which the relay needs" in line
    assert line.endswith(f"Grant them: GRANT SELECT, UPDATE ON public.outbox TO {url.username};")
    assert "event=relay.started" not in result.stderr


def test_status_needs_only_select(pg_engine: Engine, make_role: MakeRole) -> None:
    """`status` as a role that may only INSERT exits 1 naming SELECT (and nothing else) and its
    GRANT; a role with SELECT alone gets the report."""
    inserter = make_role("INSERT")
    reader = make_role("SELECT")

    refused = run_cli("status", url=inserter.render_as_string(False))
    allowed = run_cli("status", "--json", url=reader.render_as_string(False))

    assert refused.returncode == 1
    assert error_line(refused) == (
        f"Error: Role '{inserter.username}' lacks SELECT on table 'public.outbox', which "
        f"sqla-outbox status needs. Grant it: GRANT SELECT ON public.outbox TO "
        f"{inserter.username};"
    )
    assert allowed.returncode == 0, allowed.stderr


REVOKING_PUBLISHER = """
import os

import psycopg


def publish(message):
    with psycopg.connect(os.environ["REVOKE_AS"], autocommit=True) as conn:
        conn.execute(os.environ["REVOKE_SQL"])
"""


def test_a_grant_revoked_while_relaying_is_one_sentence(
    pg_engine: Engine, make_role: MakeRole, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A privilege revoked after start-up (here by the publisher, mid-pass) ends `relay --once`
    with exit 1 and one sentence quoting the driver's "permission denied" and naming what the
    relay needs, instead of the generic "run the relay again once the database is healthy"."""
    stage_inputs(pg_engine, "send_receipt", [{"n": 1}])
    url = make_role("SELECT", "UPDATE")
    (tmp_path / "revoking_publisher.py").write_text(REVOKING_PUBLISHER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv(
        "REVOKE_AS", pg_engine.url.set(drivername="postgresql").render_as_string(False)
    )
    monkeypatch.setenv("REVOKE_SQL", f"REVOKE UPDATE ON outbox FROM {url.username}")

    result = run_cli(
        "relay", "--once", url=url.render_as_string(False), publisher="revoking_publisher:publish"
    )

    assert result.returncode == 1
    line = error_line(result)
    assert "refused a statement while relaying: permission denied for table outbox." in line
    assert line.endswith("(the relay: SELECT, UPDATE; status: SELECT).")


def test_check_raises_missing_privilege_error_with_a_grant_that_works(
    pg_engine: Engine, make_role: MakeRole
) -> None:
    """In-process, `Relay.check()` raises MissingPrivilegeError (an OutboxError); a role whose
    name needs quoting gets a GRANT that quotes it, and running that GRANT makes check() pass."""
    url = make_role("SELECT", name=f"App-RO {uuid.uuid4().hex[:6]}")
    relay = outbox.Relay(url, lambda message: None)
    try:
        with pytest.raises(MissingPrivilegeError) as caught:
            relay.check()
        message = str(caught.value)
        assert isinstance(caught.value, outbox.OutboxError)
        assert message.startswith(f"Role {url.username!r} lacks UPDATE on table 'public.outbox'")
        assert f'TO "{url.username}";' in message
        with pg_engine.begin() as conn:
            conn.exec_driver_sql(grant_from(message))
        relay.check()
    finally:
        relay.close()


def test_check_names_usage_on_the_tables_schema(pg_engine: Engine, make_role: MakeRole) -> None:
    """With the table in another schema (schema_translate_map), a role that holds SELECT and
    UPDATE on it but not USAGE on the schema is told to grant USAGE on that schema, instead of
    the driver's "permission denied for schema"."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA app")
    outbox.metadata.create_all(pg_engine.execution_options(schema_translate_map={None: "app"}))
    url = make_role("SELECT", "UPDATE", schema="app")
    engine = create_engine(url).execution_options(schema_translate_map={None: "app"})
    try:
        relay = outbox.Relay(engine, lambda message: None)
        with pytest.raises(MissingPrivilegeError) as caught:
            relay.check()
        assert str(caught.value) == (
            f"Role {url.username!r} lacks USAGE on schema 'app', which the relay needs. "
            f"Grant it: GRANT USAGE ON SCHEMA app TO {url.username};"
        )
        with pg_engine.begin() as conn:
            conn.exec_driver_sql(grant_from(str(caught.value)))
        relay.check()
    finally:
        engine.dispose()


def test_check_passes_with_the_privileges_and_on_sqlite(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A role with every privilege (PostgreSQL's owner) and SQLite, which has no privileges,
    pass the check; without the table both raise MissingTableError naming the migration."""
    make_relay(engine, lambda message: None).check()

    outbox.metadata.drop_all(engine)
    fix = rf"op\.create_outbox_table\(version={outbox.SCHEMA_VERSION}\)"
    with pytest.raises(MissingTableError, match=fix):
        make_relay(engine, lambda message: None).check()


# --- databases sqla-outbox does not support ---------------------------------------------------


@pytest.mark.parametrize(
    "url", ["mssql+pyodbc://app:hunter2@db/shop", "oracle+oracledb://app:hunter2@db/shop"]
)
@pytest.mark.parametrize(
    "call",
    [
        lambda bind: outbox.Relay(bind, lambda message: None),
        lambda bind: outbox.purge(bind, older_than=dt.timedelta(days=7)),
        outbox.dead_letters,
    ],
    ids=["relay", "purge", "dead_letters"],
)
def test_other_databases_are_refused_naming_every_supported_one(
    url: str, call: Callable[[str], object]
) -> None:
    """A URL for a database sqla-outbox does not support (MSSQL, Oracle) is refused by a relay
    and by the operator functions alike, in one sentence listing PostgreSQL, SQLite and
    MySQL/MariaDB, with the password hidden."""
    with pytest.raises(ConfigurationError) as caught:
        call(url)

    message = str(caught.value)
    backend = sa.make_url(url).get_backend_name()
    assert f"is for {backend!r}, which sqla-outbox does not support; it supports PostgreSQL (" in (
        message
    )
    assert "SQLite (e.g. sqlite:///path/to/app.db) and MySQL/MariaDB (through PyMySQL, e.g. " in (
        message
    )
    assert message.endswith("mysql+pymysql://user:password@host/dbname).")
    assert "hunter2" not in message
    assert "\n" not in message


# --- malformed binds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bind", "expected"),
    [
        ("postgresql+psycopg://u:hunter2@h:abc/db", "port must be a whole number"),
        ("postgresql+psycopg://u:hunter2@h:70000/db", "has the port 70000"),
        ("postgresql+psycopg://u:hun@ter2@h/db", "write it as %40"),
        ("postgres://u:hunter2@h/db", "write postgresql+psycopg://"),
        ("foo://x", "is for 'foo'"),
        ("postgresql+nosuch://u:hunter2@h/db", "names the driver 'nosuch'"),
        ("postgresql+psycopg2cffi://u:hunter2@h/db", "needs the driver module 'psycopg2cffi'"),
        ("postgresql+asyncpg://u:hunter2@h/db", "'postgresql+psycopg://u:***@h/db' instead"),
        ("sqlite+aiosqlite://", "use an SQLite file"),
        ("not a url", "is not a database URL"),
        ("", "is not a database URL"),
        (42, "bind must be an Engine or a database URL"),
    ],
)
def test_malformed_binds_are_one_sentence_configuration_errors(bind: object, expected: str) -> None:
    """Every malformed URL given to Relay raises ConfigurationError (never ValueError from the
    URL parser, ImportError or NoSuchModuleError) in one line, quoting the URL with its password
    hidden, and nothing connects."""
    with pytest.raises(ConfigurationError) as caught:
        outbox.Relay(bind, lambda message: None)  # type: ignore[arg-type]

    message = str(caught.value)
    assert expected in message
    assert message.startswith("bind ")
    assert "\n" not in message
    assert "hunter2" not in message
    assert "ter2" not in message


def test_a_query_option_the_driver_cannot_take_is_one_sentence(sqlite_engine: Engine) -> None:
    """A query-string option the dialect cannot convert (``?timeout=abc`` on SQLite) raises
    ConfigurationError quoting the URL and saying where the fix goes, not a ValueError from
    inside SQLAlchemy."""
    url = f"sqlite:///{sqlite_engine.url.database}?timeout=abc"

    with pytest.raises(ConfigurationError) as caught:
        outbox.Relay(url, lambda message: None)

    assert str(caught.value).startswith(f"bind {url!r} has an option the driver cannot take")
    assert str(caught.value).endswith("Fix or remove it in the query string.")


# --- asyncio engines ---------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "postgresql+psycopg_async"])
def test_an_async_engine_on_psycopg_relays_through_psycopg(pg_engine: Engine, driver: str) -> None:
    """Relay(async_engine) on psycopg 3 works: the relay opens its own synchronous psycopg
    engine from the AsyncEngine's URL (the async one's connections need the greenlet bridge),
    publishes, and leaves the application's AsyncEngine unused."""
    staged = stage_inputs(pg_engine, "send_receipt", [{"n": 1}, {"n": 2}])
    async_engine = create_async_engine(pg_engine.url.set(drivername=driver))
    seen: list[outbox.OutboxMessage] = []
    relay = outbox.Relay(async_engine, seen.append)
    try:
        assert isinstance(relay.engine, Engine)
        assert relay.engine.dialect.driver == "psycopg"
        assert not relay.engine.dialect.is_async
        relay.check()
        assert relay.tick() == 2
    finally:
        relay.close()
    assert [message.id for message in seen] == [message.id for message in staged]
    assert async_engine.sync_engine.pool.checkedin() == 0


def test_an_aiosqlite_url_relays_through_sqlite3(sqlite_engine: Engine, tmp_path: Path) -> None:
    """A ``sqlite+aiosqlite:///file`` URL relays through Python's sqlite3 on the same file, with
    no aiosqlite installed: only the driver's name differs."""
    staged = stage_inputs(sqlite_engine, "send_receipt", [{"n": 1}])
    seen: list[outbox.OutboxMessage] = []
    relay = outbox.Relay(f"sqlite+aiosqlite:///{sqlite_engine.url.database}", seen.append)
    try:
        assert relay.engine.dialect.driver == "pysqlite"
        assert relay.tick() == 1
    finally:
        relay.close()
    assert [message.id for message in seen] == [staged[0].id]


def test_status_accepts_a_psycopg_async_url(pg_engine: Engine) -> None:
    """`status --url postgresql+psycopg_async://...` (the URL an asyncio application already
    has) reports on the outbox, reading it through synchronous psycopg."""
    url = pg_engine.url.set(drivername="postgresql+psycopg_async")

    result = run_cli("status", "--json", url=url.render_as_string(False))

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["pending"] == 0
    assert report["url"].startswith("postgresql+psycopg://")
