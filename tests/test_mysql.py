"""MySQL and MariaDB: the outbox table of every version, its Alembic operations, and staging.

Database tests run on the MariaDB server of ``conftest.py`` (a fresh database per test, through
PyMySQL) and are skipped, with the reason, without it. Nothing is mocked. What MySQL/MariaDB
does not have yet is the relay (its store and claim protocol): the relay, ``status``, ``purge``
and the dead-letter operations refuse it at start, pinned at the end of this file.

The staging suite of ``test_staging.py`` runs here in full on MariaDB: its test classes are
imported below, and this module's ``engine`` fixture hands them a MariaDB engine instead of
PostgreSQL's and SQLite's.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata, produce_migrations, render_python_code
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, MetaData, Table, inspect, text
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql.mariadb import MariaDBDialect
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from sqlalchemy.schema import CreateIndex, CreateTable

# The staging suite, run here on MariaDB (see the module docs). Imported under their own names:
# pytest collects every Test* class of this module's namespace.
from test_staging import (
    Base,
    TestBatching,
    TestCommit,
    TestEnqueueDuringCommit,
    TestExternalTransaction,
    TestInputChecks,
    TestRollback,
    TestSavepoints,
    TestSessionKinds,
)

import alembic_ext  # noqa: F401 - registers op.create_outbox_table
import sqla_outbox as outbox
from sqla_outbox import versions
from sqla_outbox.cli import main
from sqla_outbox.engines import create_engine
from sqla_outbox.validation import MYSQL_MAX_INPUT_DEPTH, RUN_AT_RANGE

# The imported suite, named here so linters see it used.
__all__ = [
    "TestBatching",
    "TestCommit",
    "TestEnqueueDuringCommit",
    "TestExternalTransaction",
    "TestInputChecks",
    "TestRollback",
    "TestSavepoints",
    "TestSessionKinds",
]

EXAMPLE_INI = Path(__file__).resolve().parent.parent / "examples" / "alembic" / "alembic.ini"
COMPARE_OPTS: dict[str, Any] = {"compare_type": True, "compare_server_default": True}
MAPPED: Table = cast(Table, outbox.OutboxRow.__table__)
SCHEMES = ["mysql+pymysql", "mariadb+pymysql"]

# --- the DDL of each version on MySQL and MariaDB, frozen ---------------------------------------
#
# Written down when MySQL support was added; like the PostgreSQL and SQLite DDL pinned in
# test_versions.py, never update these to follow the code.

_COLUMNS_1 = [
    "id BINARY(16) NOT NULL",
    "job VARCHAR(255) NOT NULL",
    "queue VARCHAR(255) NOT NULL DEFAULT 'default'",
    "input JSON NOT NULL",
    "idempotency_key VARCHAR(255) NOT NULL",
    "max_attempts INTEGER NOT NULL DEFAULT 3",
    "run_at DATETIME(6) NOT NULL",
    "staged_at DATETIME(6) NOT NULL",
    "tenant_id VARCHAR(255)",
    "traceparent VARCHAR(55)",
    "enqueued_by VARCHAR(255)",
    "claimed_by VARCHAR(255)",
    "claimed_at DATETIME(6)",
    "published_at DATETIME(6)",
    "attempts INTEGER NOT NULL DEFAULT 0",
    "last_error TEXT",
]
_COLUMNS_2 = [
    *_COLUMNS_1,
    "ordering_key VARCHAR(255)",
    "retry_at DATETIME(6)",
    "dead_at DATETIME(6)",
    "parked BOOL NOT NULL DEFAULT false",
]
_OPTIONS = {
    1: "ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin",
    2: "ENGINE=InnoDB CHARSET=utf8mb4 COMMENT='sqla-outbox schema 2' COLLATE utf8mb4_bin",
    3: "ENGINE=InnoDB CHARSET=utf8mb4 COMMENT='sqla-outbox schema 3' COLLATE utf8mb4_bin",
}
MYSQL_INDEXES = {
    "ix_outbox_unpublished": "(published_at, staged_at, id)",
    "ix_outbox_claimable": "(published_at, dead_at, parked, staged_at, id)",
    "ix_outbox_key": "(published_at, ordering_key, staged_at, id)",
    "ix_outbox_failing": "(published_at, attempts, staged_at, id)",
    "ix_outbox_parked_group": "(parked, staged_at)",
    "ix_outbox_parked_key": "(parked, ordering_key)",
    "ix_outbox_published": "(published_at)",
}


def mysql_create_table(version: int) -> str:
    """The pinned ``CREATE TABLE`` of ``version`` on MySQL and MariaDB."""
    columns = _COLUMNS_1 if version == 1 else _COLUMNS_2
    body = "".join(f"\t{column}, \n" for column in columns)
    return (
        f"\nCREATE TABLE outbox (\n{body}\tCONSTRAINT pk_outbox PRIMARY KEY (id)\n)"
        f"{_OPTIONS[version]}\n\n"
    )


def index_columns(conn: sa.Connection) -> dict[str, list[str]]:
    """The outbox's indexes as the database has them: name -> columns."""
    return {
        str(index["name"]): [str(name) for name in index["column_names"]]
        for index in inspect(conn).get_indexes("outbox")
    }


def operations(conn: sa.Connection) -> Any:
    """Alembic's ``op`` bound to ``conn`` (``Any``: the outbox ops are attached at runtime)."""
    return Operations(MigrationContext.configure(conn))


def example_config(url: URL, buffer: io.StringIO | None = None) -> Config:
    """A ``Config`` for ``examples/alembic`` pinned to ``url``, leaving the host's logging alone."""
    cfg = Config(str(EXAMPLE_INI), output_buffer=buffer)
    cfg.set_main_option(
        "sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%")
    )
    cfg.attributes["configure_logging"] = False
    return cfg


@pytest.fixture
def engine(mariadb_engine: Engine) -> Engine:
    """The staging suite's engine (see the module docs): MariaDB, with the outbox table."""
    return mariadb_engine


@pytest.fixture
def db(engine: Engine) -> Engine:
    """The staging suite's ``db``: the engine with its ``orders`` tables too."""
    Base.metadata.create_all(engine)
    return engine


@pytest.fixture(params=SCHEMES)
def empty(request: pytest.FixtureRequest, mariadb_url: URL) -> Iterator[Engine]:
    """An engine on an empty MariaDB database, through a ``mysql://`` URL (dialect ``mysql``)
    and a ``mariadb://`` one (dialect ``mariadb``): the table must be the same through both."""
    engine = create_engine(mariadb_url.set(drivername=request.param))
    yield engine
    engine.dispose()


# --- the table's definition ------------------------------------------------------------------


@pytest.mark.parametrize("version", versions.VERSIONS)
@pytest.mark.parametrize("dialect", [mysql.dialect(), MariaDBDialect()], ids=["mysql", "mariadb"])
def test_each_version_on_mysql_is_frozen(version: int, dialect: sa.Dialect) -> None:
    """Every version compiles on both dialects to the pinned DDL: BINARY(16) ids, DATETIME(6)
    timestamps, JSON, the PostgreSQL VARCHAR lengths, an InnoDB utf8mb4 table with the binary
    collation and the version in its comment, and each index on its MySQL columns (no WHERE)."""
    table = versions.build_table(version, MetaData())
    assert str(CreateTable(table).compile(dialect=dialect)) == mysql_create_table(version)
    expected = {
        name: f"CREATE INDEX {name} ON outbox {columns}"
        for name, columns in MYSQL_INDEXES.items()
        if name in {str(index.name) for index in table.indexes}
    }
    compiled = {str(i.name): str(CreateIndex(i).compile(dialect=dialect)) for i in table.indexes}
    assert compiled == expected
    assert len(compiled) == {1: 1, 2: 6, 3: 7}[version]


def test_each_mysql_index_leads_with_its_predicates_columns() -> None:
    """The rule IndexSpec states: an index's MySQL columns are the columns its predicate tests,
    in the order it names them, then its own columns, so the partial index's rows are one range
    at the index's start; and every index has such a form."""
    names = set(versions.column_names(versions.SCHEMA_VERSION))
    for step in versions.STEPS.values():
        for spec in step.indexes:
            tested = [w for w in re.findall(r"[a-z_]+", spec.where) if w in names]
            leading = list(dict.fromkeys(tested))
            rest = [column for column in spec.columns if column not in leading]
            assert spec.mysql_columns == (*leading, *rest), spec.name


def test_the_index_rule_touches_only_the_outbox() -> None:
    """An index named like the outbox's on another table, or on other columns, compiles as
    SQLAlchemy compiles it: the MySQL columns apply only to the outbox's own indexes."""
    other = Table(
        "jobs", MetaData(), sa.Column("staged_at", sa.DateTime), sa.Column("id", sa.Integer)
    )
    index = sa.Index("ix_outbox_unpublished", other.c.staged_at, other.c.id)
    assert str(CreateIndex(index).compile(dialect=mysql.dialect())) == (
        "CREATE INDEX ix_outbox_unpublished ON jobs (staged_at, id)"
    )
    table = versions.build_table(1, MetaData())
    moved = sa.Index("ix_outbox_unpublished", table.c.id)
    assert versions.mysql_index_columns(moved) is None


def test_create_all_builds_the_table_on_mariadb(empty: Engine) -> None:
    """outbox.metadata.create_all() through either URL builds the same table: the pinned column
    types, utf8mb4 with utf8mb4_bin, InnoDB, the version comment read back as version 3, the
    indexes on their MySQL columns, and no trigger (relays poll there)."""
    outbox.metadata.create_all(empty)
    with empty.connect() as conn:
        ddl = conn.execute(text("SHOW CREATE TABLE outbox")).one()[1]
        assert "`id` binary(16) NOT NULL" in ddl
        assert "`staged_at` datetime(6) NOT NULL" in ddl
        assert "`job` varchar(255) NOT NULL" in ddl
        assert "`traceparent` varchar(55)" in ddl
        assert "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin" in ddl
        assert "COMMENT='sqla-outbox schema 3'" in ddl
        assert versions.table_version(conn, MAPPED) == 3
        expected = {name: columns[1:-1].split(", ") for name, columns in MYSQL_INDEXES.items()}
        assert index_columns(conn) == expected
        triggers = text(
            "SELECT count(*) FROM information_schema.TRIGGERS "
            "WHERE EVENT_OBJECT_SCHEMA = DATABASE()"
        )
        assert conn.execute(triggers).scalar() == 0
    outbox.metadata.drop_all(empty)


# --- Alembic ------------------------------------------------------------------------------------


def test_alembic_example_upgrade_check_downgrade(mariadb_url: URL) -> None:
    """examples/alembic end to end on MariaDB, through the same migrations as on PostgreSQL:
    `upgrade 0001` (version 1), `0002` (version 2), `head` (version 3, each index on its MySQL
    columns), `alembic check` finds nothing to generate, and `downgrade base` goes back through
    versions 2 and 1 and removes both tables."""
    cfg = example_config(mariadb_url)
    engine = create_engine(mariadb_url)
    try:
        command.upgrade(cfg, "0001")
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 1
        command.upgrade(cfg, "0002")
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 2
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 3
            indexes = index_columns(conn)
        for name, columns in MYSQL_INDEXES.items():
            assert indexes[name] == columns[1:-1].split(", ")
        command.check(cfg)  # raises AutogenerateDiffsDetected on any pending change

        command.downgrade(cfg, "0002")
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 2
        command.downgrade(cfg, "0001")
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 1
        command.downgrade(cfg, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()


def test_autogenerate_writes_the_outbox_operations(empty: Engine) -> None:
    """Autogenerate on MariaDB writes op.create_outbox_table(version=3) for a missing outbox,
    op.upgrade_outbox_table(1, 3) for a version-1 one, and nothing once it is current, with
    compare_type and compare_server_default on (the MySQL index columns and parked's default
    reported as 0 are the version's own)."""
    with empty.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=COMPARE_OPTS)
        upgrade = render_python_code(produce_migrations(ctx, outbox.metadata).upgrade_ops)
    assert "op.create_outbox_table(version=3)" in upgrade
    assert "create_index" not in upgrade

    with empty.begin() as conn:
        operations(conn).create_outbox_table()
    with empty.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=COMPARE_OPTS)
        upgrade = render_python_code(produce_migrations(ctx, outbox.metadata).upgrade_ops)
    assert "op.upgrade_outbox_table(1, 3)" in upgrade
    assert "index" not in upgrade

    with empty.begin() as conn:
        operations(conn).upgrade_outbox_table(1, 3)
    with empty.connect() as conn:
        assert (
            compare_metadata(MigrationContext.configure(conn, opts=COMPARE_OPTS), outbox.metadata)
            == []
        )


def test_autogenerate_still_reports_a_changed_index(empty: Engine) -> None:
    """Only the version's own MySQL form is taken as equal: an outbox index rebuilt on other
    columns is still reported (dropped and created again)."""
    outbox.metadata.create_all(empty)
    with empty.begin() as conn:
        conn.execute(text("DROP INDEX ix_outbox_key ON outbox"))
        conn.execute(text("CREATE INDEX ix_outbox_key ON outbox (published_at, ordering_key)"))
    with empty.connect() as conn:
        diffs = compare_metadata(
            MigrationContext.configure(conn, opts=COMPARE_OPTS), outbox.metadata
        )
    assert [(diff[0], diff[1].name) for diff in diffs] == [
        ("remove_index", "ix_outbox_key"),
        ("add_index", "ix_outbox_key"),
    ]


def test_upgrade_keeps_every_row_up_and_down(empty: Engine) -> None:
    """op.upgrade_outbox_table(1, 3) on a MariaDB table holding a row keeps it (its microsecond
    timestamps too) and gives it the new columns' defaults; (3, 1) keeps it again; the
    version is read back from the comment (and, once dropped, from the layout)."""
    staged_at = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)
    row_id = uuid.UUID("018f0000-0000-7000-8000-000000000001")
    v1 = versions.build_table(1, MetaData())
    with empty.begin() as conn:
        operations(conn).create_outbox_table()
        conn.execute(
            v1.insert(),
            {
                "id": row_id,
                "job": "j",
                "input": {"a": 1},
                "idempotency_key": "k",
                "run_at": staged_at,
                "staged_at": staged_at,
            },
        )
    with empty.begin() as conn:
        operations(conn).upgrade_outbox_table(1, 3)
    with empty.connect() as conn:
        assert versions.table_version(conn, MAPPED) == 3
        row = conn.execute(sa.select(MAPPED)).mappings().one()
    assert (row["id"], row["staged_at"], row["input"]) == (row_id, staged_at, {"a": 1})
    assert (row["parked"], row["ordering_key"], row["queue"]) == (False, None, "default")

    with empty.begin() as conn:
        operations(conn).upgrade_outbox_table(3, 1)
    with empty.connect() as conn:
        assert versions.table_version(conn, MAPPED) == 1
        assert conn.execute(sa.select(v1.c.id, v1.c.run_at)).one() == (row_id, staged_at)
    with empty.begin() as conn:
        operations(conn).drop_outbox_table()
    assert not inspect(empty).has_table("outbox")


@pytest.mark.parametrize(
    ("scheme", "exists"), [("mysql+pymysql", ""), ("mariadb+pymysql", "IF NOT EXISTS ")]
)
def test_offline_sql_on_mysql_and_mariadb(scheme: str, exists: str) -> None:
    """`alembic upgrade head --sql` through the example env for a MySQL or MariaDB URL prints
    the table (utf8mb4, InnoDB), each index on its MySQL columns with no WHERE, the upgrades'
    ADD COLUMNs and comments, `IF NOT EXISTS` only for MariaDB (MySQL 8 has no such clause),
    and no trigger; it connects to nothing."""
    buffer = io.StringIO()
    url = sa.make_url(f"{scheme}://nobody@invalid.invalid/none")
    command.upgrade(example_config(url, buffer), "head", sql=True)
    sql = buffer.getvalue()
    assert "CREATE TABLE outbox (\n    id BINARY(16) NOT NULL," in sql
    assert ")ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;" in sql
    assert "CREATE INDEX ix_outbox_unpublished ON outbox (published_at, staged_at, id);" in sql
    assert (
        f"CREATE INDEX {exists}ix_outbox_claimable ON outbox "
        "(published_at, dead_at, parked, staged_at, id);"
    ) in sql
    assert f"CREATE INDEX {exists}ix_outbox_published ON outbox (published_at);" in sql
    assert "ALTER TABLE outbox ADD COLUMN parked BOOL NOT NULL DEFAULT false;" in sql
    assert "ALTER TABLE outbox COMMENT 'sqla-outbox schema 3';" in sql
    assert "WHERE published_at" not in sql
    assert "TRIGGER" not in sql
    assert "FUNCTION" not in sql


# --- staging on MariaDB (beyond the imported suite) ---------------------------------------------


def test_timestamps_keep_microseconds_and_come_back_aware_utc(db: Engine) -> None:
    """run_at and staged_at round-trip to the microsecond as aware UTC datetimes, whatever the
    zone given; the column holds the UTC wall-clock time (DATETIME(6) has no zone)."""
    run_at = dt.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    with Session(db) as session:
        message = outbox.enqueue(session, "x", run_at=run_at)
        session.commit()
    with Session(db) as session:
        row = session.scalars(sa.select(outbox.OutboxRow)).one()
    assert row.run_at == run_at
    assert row.run_at.tzinfo is dt.timezone.utc
    assert row.staged_at == message.staged_at
    with db.connect() as conn:
        stored = conn.execute(text("SELECT run_at FROM outbox")).scalar_one()
    assert stored == dt.datetime(2030, 1, 2, 1, 4, 5, 678901)


@pytest.mark.parametrize("run_at", RUN_AT_RANGE, ids=["earliest", "latest"])
def test_run_at_at_either_end_of_its_range_commits(db: Engine, run_at: dt.datetime) -> None:
    """The earliest and latest run_at enqueue accepts (years 1 and 9999) commit on MariaDB and
    read back equal: its DATETIME takes them, whatever its documented range says."""
    with Session(db) as session:
        outbox.enqueue(session, "x", run_at=run_at)
        session.commit()
    with Session(db) as session:
        assert session.scalars(sa.select(outbox.OutboxRow.run_at)).one() == run_at


def test_claim_order_is_enqueue_order(db: Engine) -> None:
    """ORDER BY staged_at, id (the claim order) is enqueue order, within a transaction (one
    staged_at, ids as BINARY(16) bytes) and across transactions; HEX(id) is the UUID's hex."""
    made = []
    for batch in range(3):
        with Session(db) as session:
            made += [outbox.enqueue(session, f"job-{batch}-{i}") for i in range(200)]
            session.commit()
    with Session(db) as session:
        order = (outbox.OutboxRow.staged_at, outbox.OutboxRow.id)
        ids = list(session.scalars(sa.select(outbox.OutboxRow.id).order_by(*order)))
    assert ids == [message.id for message in made]
    with db.connect() as conn:
        hexes = conn.execute(text("SELECT LOWER(HEX(id)) FROM outbox ORDER BY id")).scalars()
        assert list(hexes) == [message.id.hex for message in made]


def test_ids_sort_byte_wise() -> None:
    """BINARY(16) sorts ids as their bytes, the order UUIDv7 ids are made in: ids that differ
    only in a late byte, or across a millisecond, compare as their integers do."""
    ids = sorted(
        [
            uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62) | tail)
            for ms in (1, 2, 256)
            for tail in (0, 1, 255)
        ]
    )
    assert sorted(ids, key=lambda value: value.bytes) == ids


def test_four_byte_utf8_round_trips(db: Engine) -> None:
    """utf8mb4: emoji (four bytes in UTF-8) in the text columns, at the full 255 characters,
    and in input keys and values are stored and read back unchanged."""
    long_key = "😀" * 255
    with Session(db) as session:
        outbox.enqueue(
            session,
            "envoyer_😀",
            {"clé 🎉": ["🚀", "𝄞"]},
            queue="🧵",
            ordering_key=long_key,
            tenant_id="tenant-\U0001d518",
        )
        session.commit()
    with Session(db) as session:
        row = session.scalars(sa.select(outbox.OutboxRow)).one()
    assert (row.job, row.queue, row.ordering_key, row.tenant_id) == (
        "envoyer_😀",
        "🧵",
        long_key,
        "tenant-\U0001d518",
    )
    assert row.input == {"clé 🎉": ["🚀", "𝄞"]}


def nested(depth: int) -> Any:
    """``depth`` dicts, each inside the one before: ``{"a": {"a": ... 1}}``."""
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def test_input_as_deep_as_mariadb_takes_commits(db: Engine) -> None:
    """Input nested MYSQL_MAX_INPUT_DEPTH (31) containers deep commits and reads back: the
    most MariaDB's JSON_VALID accepts."""
    with Session(db) as session:
        outbox.enqueue(session, "x", nested(MYSQL_MAX_INPUT_DEPTH))
        session.commit()
    with Session(db) as session:
        assert session.scalars(sa.select(outbox.OutboxRow.input)).one() == nested(
            MYSQL_MAX_INPUT_DEPTH
        )


def test_input_deeper_than_mariadb_takes_is_refused_at_the_call(db: Engine) -> None:
    """One container deeper is refused at the enqueue call (not at commit by the JSON_VALID
    check), naming the limit and MariaDB, leaving the session as it was; so is it through a
    Core Connection. MariaDB itself refuses it: the limit is the database's."""
    with Session(db) as session:
        with pytest.raises(
            outbox.ConfigurationError,
            match=r"more than 31 deep, the most MariaDB's JSON takes .* at level 32",
        ):
            outbox.enqueue(session, "x", nested(MYSQL_MAX_INPUT_DEPTH + 1))
        assert outbox.staged(session) == ()
        assert not session.in_transaction()
    with (
        db.begin() as conn,
        pytest.raises(outbox.ConfigurationError, match="more than 31 deep"),
    ):
        outbox.enqueue(conn, "x", nested(MYSQL_MAX_INPUT_DEPTH + 1))
    if not db.dialect.is_mariadb:
        return  # MySQL's own JSON takes 100; the limit is MariaDB's, kept on both
    now = dt.datetime.now(dt.timezone.utc)
    row = {"id": uuid.uuid4(), "job": "x", "idempotency_key": "k", "run_at": now, "staged_at": now}
    with db.connect() as conn, pytest.raises(sa.exc.DBAPIError, match="CONSTRAINT"):
        conn.execute(MAPPED.insert(), {**row, "input": nested(MYSQL_MAX_INPUT_DEPTH + 1)})


def test_enqueue_on_a_version_1_table_names_the_upgrade(mariadb_url: URL) -> None:
    """On a MariaDB table still at version 1, the commit raises SchemaVersionError naming
    op.upgrade_outbox_table(1, 3) (recognised from MySQL's "Unknown column"), and writes
    nothing."""
    engine = create_engine(mariadb_url)
    try:
        with engine.begin() as conn:
            operations(conn).create_outbox_table()
        with Session(engine) as session:
            outbox.enqueue(session, "send_receipt", {"order_id": 1})
            with pytest.raises(outbox.SchemaVersionError, match=r"upgrade_outbox_table\(1, 3\)"):
                session.commit()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 0
    finally:
        engine.dispose()


# --- what MySQL/MariaDB does not have yet: the relay and the operator commands ----------------

STAGING_ONLY = (
    "(MySQL/MariaDB), which sqla-outbox supports only for staging (outbox.enqueue) and the "
    "outbox table's Alembic operations until its relay store for them exists; for relays, "
    "status, purge and dead letters it supports PostgreSQL"
)


def test_relay_and_operator_calls_refuse_mysql_at_start(mariadb_engine: Engine) -> None:
    """Relay(...), purge, dead_letters, retry_dead and discard_dead on a MariaDB engine or URL
    raise ConfigurationError with one sentence saying MySQL/MariaDB is supported for staging
    only, before connecting."""
    url = mariadb_engine.url.render_as_string(hide_password=False)
    calls = [
        lambda bind: outbox.Relay(bind, lambda message: None),
        lambda bind: outbox.purge(bind, older_than=dt.timedelta(days=7)),
        outbox.dead_letters,
        outbox.retry_dead,
        outbox.discard_dead,
    ]
    connects: list[object] = []
    sa.event.listen(mariadb_engine, "connect", lambda *args: connects.append(args))
    mariadb_engine.dispose()
    for call in calls:
        for bind in (mariadb_engine, url):
            with pytest.raises(outbox.ConfigurationError) as caught:
                call(bind)
            assert STAGING_ONLY in str(caught.value)
            assert "\n" not in str(caught.value)
    assert connects == []


@pytest.mark.parametrize(
    "args",
    [
        ["relay", "--publisher", "stdout", "--once"],
        ["status"],
        ["purge", "--older-than", "7d"],
        ["dead", "list"],
    ],
    ids=["relay", "status", "purge", "dead"],
)
def test_cli_commands_refuse_mysql(
    args: list[str], mariadb_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    """`relay`, `status`, `purge` and `dead` on a MariaDB URL exit 2 with one `Error:` line
    saying MySQL/MariaDB is supported for staging only, with no traceback."""
    url = mariadb_url.render_as_string(hide_password=False)
    command_name, *rest = args
    argv = [command_name, *rest[:1]] if command_name == "dead" else [command_name]
    argv += ["--url", url, *(rest[1:] if command_name == "dead" else rest)]

    code = main(argv)

    captured = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in captured.err
    [line] = [line for line in captured.err.splitlines() if line.startswith("Error:")]
    assert f"is for 'mysql' {STAGING_ONLY}" in line
