"""MySQL and MariaDB: the outbox table of every version, its Alembic operations, staging, and
the operator commands (``status``, the metrics' backlog, dead letters, ``purge``).

Database tests run on the MariaDB server of ``conftest.py`` (a fresh database per test, through
PyMySQL) and are skipped, with the reason, without it. Nothing is mocked. The relay's store on
MySQL/MariaDB runs the conformance and property suites of ``tests/stores``; this module pins the
statements it runs besides the claim (the parked-row sweep and the idle query).

The staging suite of ``test_staging.py`` runs here in full on MariaDB: its test classes are
imported below, and this module's ``engine`` fixture hands them a MariaDB engine instead of
PostgreSQL's and SQLite's.
"""

from __future__ import annotations

import datetime as dt
import io
import json
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
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
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
from sqla_outbox import queries, retention, versions
from sqla_outbox.cli import main
from sqla_outbox.engines import create_engine
from sqla_outbox.metrics import BacklogNumbers, read_backlog
from sqla_outbox.stores.operating import MySQLOperations
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
_COLUMNS_4 = [*_COLUMNS_2, "wake_at DATETIME(6)"]
_COLUMNS = {
    1: _COLUMNS_1,
    2: _COLUMNS_2,
    3: _COLUMNS_2,
    4: _COLUMNS_4,
    5: [*_COLUMNS_4, "parked_behind BINARY(16)"],
}
_OPTIONS = {
    1: "ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin",
    2: "ENGINE=InnoDB CHARSET=utf8mb4 COMMENT='sqla-outbox schema 2' COLLATE utf8mb4_bin",
    3: "ENGINE=InnoDB CHARSET=utf8mb4 COMMENT='sqla-outbox schema 3' COLLATE utf8mb4_bin",
    4: "ENGINE=InnoDB CHARSET=utf8mb4 COMMENT='sqla-outbox schema 4' COLLATE utf8mb4_bin",
    5: "ENGINE=InnoDB CHARSET=utf8mb4 COMMENT='sqla-outbox schema 5' COLLATE utf8mb4_bin",
}
MYSQL_INDEXES = {
    "ix_outbox_unpublished": "(published_at, staged_at, id)",
    "ix_outbox_claimable": "(published_at, dead_at, parked, staged_at, id)",
    "ix_outbox_key": "(published_at, ordering_key, staged_at, id)",
    "ix_outbox_failing": "(published_at, attempts, staged_at, id)",
    "ix_outbox_parked_group": "(parked, staged_at)",
    "ix_outbox_parked_key": "(parked, ordering_key)",
    "ix_outbox_published": "(published_at)",
    "ix_outbox_waking": "(wake_at)",
    "ix_outbox_parked_behind": "(parked_behind)",
}
CURRENT = versions.SCHEMA_VERSION


def mysql_create_table(version: int) -> str:
    """The pinned ``CREATE TABLE`` of ``version`` on MySQL and MariaDB."""
    body = "".join(f"\t{column}, \n" for column in _COLUMNS[version])
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
    assert len(compiled) == {1: 1, 2: 6, 3: 7, 4: 8, 5: 9}[version]


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
    types, utf8mb4 with utf8mb4_bin, InnoDB, the version comment read back as the current
    version, the indexes on their MySQL columns, and no trigger (relays poll there)."""
    outbox.metadata.create_all(empty)
    with empty.connect() as conn:
        ddl = conn.execute(text("SHOW CREATE TABLE outbox")).one()[1]
        assert "`id` binary(16) NOT NULL" in ddl
        assert "`staged_at` datetime(6) NOT NULL" in ddl
        assert "`job` varchar(255) NOT NULL" in ddl
        assert "`traceparent` varchar(55)" in ddl
        assert "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin" in ddl
        assert "`wake_at` datetime(6) DEFAULT NULL" in ddl
        assert "`parked_behind` binary(16) DEFAULT NULL" in ddl
        assert f"COMMENT='sqla-outbox schema {CURRENT}'" in ddl
        assert versions.table_version(conn, MAPPED) == CURRENT
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
    `upgrade 0001` (version 1), `0002` (version 2), `0003` (version 3), `0004` (version 4),
    `head` (version 5, each index on its MySQL columns), `alembic check` finds nothing to
    generate, and `downgrade base` goes back through versions 4, 3, 2 and 1 and removes both
    tables."""
    cfg = example_config(mariadb_url)
    engine = create_engine(mariadb_url)

    def migrate(step: Any, revision: str, version: int) -> None:
        step(cfg, revision)
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == version

    try:
        migrate(command.upgrade, "0001", 1)
        migrate(command.upgrade, "0002", 2)
        migrate(command.upgrade, "0003", 3)
        migrate(command.upgrade, "0004", 4)
        migrate(command.upgrade, "head", 5)
        with engine.connect() as conn:
            indexes = index_columns(conn)
        for name, columns in MYSQL_INDEXES.items():
            assert indexes[name] == columns[1:-1].split(", ")
        command.check(cfg)  # raises AutogenerateDiffsDetected on any pending change

        migrate(command.downgrade, "0004", 4)
        migrate(command.downgrade, "0003", 3)
        migrate(command.downgrade, "0002", 2)
        migrate(command.downgrade, "0001", 1)
        command.downgrade(cfg, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()


def test_autogenerate_writes_the_outbox_operations(empty: Engine) -> None:
    """Autogenerate on MariaDB writes op.create_outbox_table(version=5) for a missing outbox,
    op.upgrade_outbox_table(1, 5) for a version-1 one, and nothing once it is current, with
    compare_type and compare_server_default on (the MySQL index columns and parked's default
    reported as 0 are the version's own)."""
    with empty.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=COMPARE_OPTS)
        upgrade = render_python_code(produce_migrations(ctx, outbox.metadata).upgrade_ops)
    assert f"op.create_outbox_table(version={CURRENT})" in upgrade
    assert "create_index" not in upgrade

    with empty.begin() as conn:
        operations(conn).create_outbox_table()
    with empty.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=COMPARE_OPTS)
        upgrade = render_python_code(produce_migrations(ctx, outbox.metadata).upgrade_ops)
    assert f"op.upgrade_outbox_table(1, {CURRENT})" in upgrade
    assert "index" not in upgrade

    with empty.begin() as conn:
        operations(conn).upgrade_outbox_table(1, CURRENT)
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
    """op.upgrade_outbox_table(1, 5) on a MariaDB table holding a row keeps it (its microsecond
    timestamps too) and gives it the new columns' defaults; once parked until it is due (as a
    relay's sweep parks it), (5, 3) unparks it, as version 3 has nothing that would wake it,
    and (3, 1) keeps it again; the version is read back from the comment (and, once dropped,
    from the layout)."""
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
        operations(conn).upgrade_outbox_table(1, CURRENT)
    with empty.connect() as conn:
        assert versions.table_version(conn, MAPPED) == CURRENT
        row = conn.execute(sa.select(MAPPED)).mappings().one()
    assert (row["id"], row["staged_at"], row["input"]) == (row_id, staged_at, {"a": 1})
    assert (row["parked"], row["ordering_key"], row["queue"]) == (False, None, "default")
    assert (row["wake_at"], row["parked_behind"]) == (None, None)

    with empty.begin() as conn:
        conn.execute(sa.update(MAPPED).values(parked=True, wake_at=MAPPED.c.run_at))
        operations(conn).upgrade_outbox_table(CURRENT, 3)
    v3 = versions.build_table(3, MetaData())
    with empty.connect() as conn:
        assert versions.table_version(conn, MAPPED) == 3
        assert conn.execute(sa.select(v3.c.id, v3.c.parked)).one() == (row_id, False)

    with empty.begin() as conn:
        operations(conn).upgrade_outbox_table(3, 1)
    with empty.connect() as conn:
        assert versions.table_version(conn, MAPPED) == 1
        assert conn.execute(sa.select(v1.c.id, v1.c.run_at)).one() == (row_id, staged_at)
    with empty.begin() as conn:
        operations(conn).drop_outbox_table()
    assert not inspect(empty).has_table("outbox")


def test_upgrade_from_version_4_to_5_unparks_the_rows_parked_behind_a_holder(
    empty: Engine,
) -> None:
    """On MariaDB, op.upgrade_outbox_table(4, 5) keeps every row of a version-4 table (a dead
    letter, a row parked behind it, a row parked until it is due; microsecond timestamps
    too), parked_behind reading NULL on each; the row parked behind the holder (parked, no
    wake_at) is unparked, the row parked until due keeps its parking and its wake_at; the index
    is on (parked_behind) and autogenerate then finds nothing. (5, 4), with the row parked
    behind the dead letter again and naming it, unparks it likewise, keeps the other, drops
    the column and the index, and compares clean against version 4."""
    v4 = versions.build_table(4, MetaData())
    v5 = versions.build_table(5, MetaData())
    staged_at = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)
    holder, held, due = (uuid.UUID(f"018f0000-0000-7000-8000-00000000000{n}") for n in (1, 2, 3))
    with empty.begin() as conn:
        operations(conn).create_outbox_table(version=4)
        conn.execute(
            v4.insert(),
            [
                {
                    "id": row_id,
                    "job": job,
                    "input": {"n": n},
                    "idempotency_key": f"k-{n}",
                    "run_at": staged_at + dt.timedelta(days=n),
                    "staged_at": staged_at,
                    "ordering_key": "order-1",
                    "attempts": 3 if row_id == holder else 0,
                    "dead_at": staged_at if row_id == holder else None,
                    "parked": row_id != holder,
                    "wake_at": staged_at + dt.timedelta(days=n) if row_id == due else None,
                }
                for n, (row_id, job) in enumerate(
                    [(holder, "charge"), (held, "ship"), (due, "remind")], start=1
                )
            ],
        )

    def values() -> list[tuple[Any, ...]]:
        """Every row's values in version 4's columns but parked, by id."""
        kept = [column for column in v4.columns if column.name != "parked"]
        with empty.connect() as conn:
            return [tuple(row) for row in conn.execute(sa.select(*kept).order_by(v4.c.id))]

    def parking(table: Table) -> dict[uuid.UUID, tuple[Any, ...]]:
        """Each row's parked, whether it has a wake_at, and (version 5) its parked_behind."""
        columns = [table.c.parked, table.c.wake_at.is_not(None)]
        if "parked_behind" in table.c:
            columns.append(table.c.parked_behind)
        with empty.connect() as conn:
            rows = conn.execute(sa.select(table.c.id, *columns)).all()
        return {row[0]: tuple(row[1:]) for row in rows}

    def clean(version: int) -> None:
        """The table records ``version`` and autogenerate against it finds nothing."""
        metadata = MetaData()
        versions.build_table(version, metadata)
        with empty.connect() as conn:
            assert versions.table_version(conn, MAPPED) == version
            ctx = MigrationContext.configure(conn, opts=COMPARE_OPTS)
            assert compare_metadata(ctx, metadata) == []

    before = values()
    assert len(before) == 3
    assert parking(v4) == {holder: (False, False), held: (True, False), due: (True, True)}

    with empty.begin() as conn:
        operations(conn).upgrade_outbox_table(4, 5)
    clean(5)
    with empty.connect() as conn:
        assert index_columns(conn)["ix_outbox_parked_behind"] == ["parked_behind"]
    assert values() == before
    assert parking(v5) == {
        holder: (False, False, None),
        held: (False, False, None),
        due: (True, True, None),
    }

    with empty.begin() as conn:  # a claim parks it again, naming its holder
        conn.execute(sa.update(v5).where(v5.c.id == held).values(parked=True, parked_behind=holder))
        operations(conn).upgrade_outbox_table(5, 4)
    clean(4)
    with empty.connect() as conn:
        assert "ix_outbox_parked_behind" not in index_columns(conn)
        assert "parked_behind" not in {c["name"] for c in inspect(conn).get_columns("outbox")}
    assert values() == before
    assert parking(v4) == {holder: (False, False), held: (False, False), due: (True, True)}


@pytest.mark.parametrize(
    ("scheme", "exists"), [("mysql+pymysql", ""), ("mariadb+pymysql", "IF NOT EXISTS ")]
)
def test_offline_sql_on_mysql_and_mariadb(scheme: str, exists: str) -> None:
    """`alembic upgrade head --sql` through the example env for a MySQL or MariaDB URL prints
    the table (utf8mb4, InnoDB), each index on its MySQL columns with no WHERE, the upgrades'
    ADD COLUMNs and comments, 0005's UPDATE unparking the rows parked behind a holder after its
    index and before its comment, `IF NOT EXISTS` only for MariaDB (MySQL 8 has no such
    clause), and no trigger; it connects to nothing."""
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
    assert "ALTER TABLE outbox ADD COLUMN wake_at DATETIME(6);" in sql
    assert f"CREATE INDEX {exists}ix_outbox_waking ON outbox (wake_at);" in sql
    assert "ALTER TABLE outbox COMMENT 'sqla-outbox schema 4';" in sql
    unpark = (
        "UPDATE outbox SET parked=false, parked_behind=NULL "
        "WHERE outbox.parked = 1 AND outbox.wake_at IS NULL;"
    )
    assert sql.count("UPDATE outbox") == 1
    assert (
        sql.index("ALTER TABLE outbox ADD COLUMN parked_behind BINARY(16);")
        < sql.index(f"CREATE INDEX {exists}ix_outbox_parked_behind ON outbox (parked_behind);")
        < sql.index(unpark)
        < sql.index("ALTER TABLE outbox COMMENT 'sqla-outbox schema 5';")
    )
    assert "WHERE wake_at" not in sql
    assert "WHERE parked_behind" not in sql
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
    op.upgrade_outbox_table(1, 5) (recognised from MySQL's "Unknown column"), and writes
    nothing."""
    engine = create_engine(mariadb_url)
    try:
        with engine.begin() as conn:
            operations(conn).create_outbox_table()
        with Session(engine) as session:
            outbox.enqueue(session, "send_receipt", {"order_id": 1})
            fix = rf"upgrade_outbox_table\(1, {CURRENT}\)"
            with pytest.raises(outbox.SchemaVersionError, match=fix):
                session.commit()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 0
    finally:
        engine.dispose()


# --- the operator commands: status, metrics, dead letters, purge --------------------------------
#
# Rows are made with enqueue and then given the state a relay would have left them in (failed,
# dead, parked, claimed, published days ago) by direct UPDATEs, so no test needs a relay on
# MySQL or waits for a clock.

DAY = dt.timedelta(days=1)
WEEK = dt.timedelta(days=7)
T = outbox.OutboxRow
DEAD_ERROR = "RuntimeError: card declined\nTraceback (most recent call last): ..."


def url_text(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def ago(delta: dt.timedelta) -> dt.datetime:
    """An aware UTC instant ``delta`` before now."""
    return dt.datetime.now(dt.timezone.utc) - delta


def set_rows(engine: Engine, messages: list[outbox.OutboxMessage], **values: Any) -> None:
    """Give the rows of ``messages`` the column values ``values``, as a relay would have."""
    with engine.begin() as conn:
        conn.execute(sa.update(T).where(T.id.in_([m.id for m in messages])).values(**values))


def enqueue_one(engine: Engine, job: str, **options: Any) -> outbox.OutboxMessage:
    """Enqueue ``job`` in a transaction of its own (so each row is its own transaction)."""
    with Session(engine) as session:
        message = outbox.enqueue(session, job, {"job": job}, **options)
        session.commit()
    return message


class Backlog:
    """One or more rows in each state the operator commands tell apart.

    Unpublished: two plain due rows; a dead letter a month old (ordering key ``order-7``) and
    the row parked behind it; a row backing off for another hour (key ``user-3``); a failed row
    whose backoff is over (key ``user-4``); a row scheduled an hour ahead; a row in relay-a's
    live claim and one in relay-b's lapsed claim. Published: three rows ten days ago, one a day
    ago.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.due = [enqueue_one(engine, "send_receipt"), enqueue_one(engine, "send_receipt")]
        self.dead = enqueue_one(engine, "charge_card", ordering_key="order-7")
        self.parked = enqueue_one(engine, "ship_order", ordering_key="order-7")
        self.backing_off = enqueue_one(engine, "notify", ordering_key="user-3")
        self.retry_due = enqueue_one(engine, "notify", ordering_key="user-4")
        self.scheduled = enqueue_one(engine, "remind", run_at=dt.timedelta(hours=1))
        self.claimed = enqueue_one(engine, "send_receipt")
        self.lapsed = enqueue_one(engine, "send_receipt")
        self.old_published = [enqueue_one(engine, "archived") for _ in range(3)]
        self.recent_published = enqueue_one(engine, "archived")
        set_rows(
            engine,
            [self.dead],
            staged_at=ago(30 * DAY),
            run_at=ago(30 * DAY),
            attempts=5,
            last_error=DEAD_ERROR,
            dead_at=ago(29 * DAY),
        )
        set_rows(engine, [self.parked], parked=True, parked_behind=self.dead.id)
        set_rows(
            engine,
            [self.backing_off],
            attempts=1,
            last_error="TimeoutError: broker slow",
            retry_at=ago(-dt.timedelta(hours=1)),
        )
        set_rows(
            engine,
            [self.retry_due],
            attempts=2,
            last_error="ConnectionError: reset",
            retry_at=ago(dt.timedelta(minutes=1)),
        )
        set_rows(
            engine,
            [self.claimed],
            claimed_by="relay-a:0123456789abcdef",
            claimed_at=ago(dt.timedelta(seconds=5)),
        )
        set_rows(
            engine,
            [self.lapsed],
            claimed_by="relay-b:fedcba9876543210",
            claimed_at=ago(dt.timedelta(minutes=10)),
        )
        set_rows(engine, self.old_published, published_at=ago(10 * DAY))
        set_rows(engine, [self.recent_published], published_at=ago(DAY))

    @property
    def unpublished(self) -> set[uuid.UUID]:
        return {
            m.id
            for m in [
                *self.due,
                self.dead,
                self.parked,
                self.backing_off,
                self.retry_due,
                self.scheduled,
                self.claimed,
                self.lapsed,
            ]
        }


def row_ids(engine: Engine, *where: Any) -> set[uuid.UUID]:
    """The ids of the outbox rows matching ``where`` (all rows without it)."""
    with engine.connect() as conn:
        return set(conn.execute(sa.select(T.id).where(*where)).scalars())


def outbox_row(engine: Engine, message: outbox.OutboxMessage) -> Any:
    with Session(engine) as session:
        return session.get(T, message.id)


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``sqla-outbox *args`` run in this process: the exit code, stdout and stderr."""
    code = main(list(args))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def status_json(capsys: pytest.CaptureFixture[str], engine: Engine) -> dict[str, Any]:
    code, out, err = run_main(capsys, "status", "--json", "--url", url_text(engine))
    assert code == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


def test_status_reports_every_state_as_on_postgresql(
    mariadb_engine: Engine, pg_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status --json` on MariaDB counts the same rows as on PostgreSQL for the same backlog:
    pending (dead letters included), due (neither dead, parked, backing off nor scheduled, claimed
    or not), failing, backing off, dead and parked; the oldest pending age (the month-old dead
    letter); each relay's live claims, relay-b's lapsed; the failed rows holding others back in
    claim order, each with its state, attempts and whole last error."""
    reports = {}
    for engine in (mariadb_engine, pg_engine):
        Backlog(engine)
        reports[engine.dialect.name] = status_json(capsys, engine)
        # The library's status() is the object the command prints (ages read a moment later).
        library = outbox.status(engine).to_dict()
        printed = dict(reports[engine.dialect.name])
        assert library.pop("oldest_pending_age_seconds") >= printed.pop(
            "oldest_pending_age_seconds"
        )
        for relay in library["relays"] + printed["relays"]:
            relay.pop("claim_age_seconds")
        assert library == printed
    mariadb = reports.pop("mysql")
    postgresql = reports.pop("postgresql")

    counts = ("pending", "due", "failing", "backing_off", "dead", "parked")
    assert {name: mariadb[name] for name in counts} == {
        "pending": 9,
        "due": 5,
        "failing": 3,
        "backing_off": 1,
        "dead": 1,
        "parked": 1,
    }
    assert {name: postgresql[name] for name in counts} == {name: mariadb[name] for name in counts}
    for report in (mariadb, postgresql):
        assert 30 * 86_400 <= report["oldest_pending_age_seconds"] < 30 * 86_400 + 60

    def relays(report: dict[str, Any]) -> list[tuple[str, int, int, bool]]:
        return [(r["relay_id"], r["claims"], r["rows_held"], r["lapsed"]) for r in report["relays"]]

    assert relays(mariadb) == [("relay-a", 1, 1, False), ("relay-b", 1, 1, True)]
    assert relays(postgresql) == relays(mariadb)

    def holding(report: dict[str, Any]) -> list[tuple[Any, ...]]:
        fields = ("job", "ordering_key", "attempts", "state", "last_error")
        return [tuple(row[name] for name in fields) for row in report["holding"]]

    assert holding(mariadb) == [
        ("charge_card", "order-7", 5, "dead", DEAD_ERROR),
        ("notify", "user-3", 1, "backing_off", "TimeoutError: broker slow"),
        ("notify", "user-4", 2, "due", "ConnectionError: reset"),
    ]
    assert holding(postgresql) == holding(mariadb)
    dead_at, retry_at = mariadb["holding"][0]["dead_at"], mariadb["holding"][1]["retry_at"]
    assert dt.datetime.fromisoformat(dead_at) < ago(28 * DAY)
    assert dt.datetime.fromisoformat(retry_at) > ago(dt.timedelta(0))


def test_status_table_and_thresholds_on_mariadb(
    mariadb_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """The `status` table on MariaDB prints the counts, each failed row with its state and the
    first line of its error, and the live claims (relay-b marked lapsed); --max-dead 0 then
    exits 3 naming the threshold, --max-dead 1 exits 0."""
    backlog = Backlog(mariadb_engine)
    url = url_text(mariadb_engine)

    code, out, _ = run_main(capsys, "status", "--url", url)

    assert code == 0
    for label, value in [
        (r"pending \(unpublished\)", 9),
        ("due now", 5),
        ("with failed attempts", 3),
        (r"backing off \(retrying\)", 1),
        ("dead letters", 1),
        (r"parked \(held back\)", 1),
    ]:
        assert re.search(rf"^  {label}\s+{value}$", out, re.MULTILINE), label
    assert re.search(
        rf"^\s+{backlog.dead.id}\s+charge_card\s+order-7\s+5\s+dead letter\s+RuntimeError: card "
        r"declined$",
        out,
        re.MULTILINE,
    )
    assert re.search(
        rf"^\s+{backlog.backing_off.id}\s+notify\s+user-3\s+1\s+backing off", out, re.M
    )
    assert re.search(
        rf"^\s+{backlog.retry_due.id}\s+notify\s+user-4\s+2\s+due for retry", out, re.M
    )
    assert re.search(r"^\s+relay-a\s+1\s+1\s+[\d.]+ s$", out, re.MULTILINE)
    assert re.search(r"^\s+relay-b\s+1\s+1\s+[\d.]+ s  lapsed: any relay may", out, re.MULTILINE)

    code, _, err = run_main(capsys, "status", "--url", url, "--max-dead", "0")
    assert code == 3
    assert "Threshold crossed: 1 dead letter, over --max-dead 0" in err
    assert run_main(capsys, "status", "--url", url, "--max-dead", "1")[0] == 0


def test_metrics_backlog_matches_status_on_mariadb(
    mariadb_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """The metrics' backlog query on MariaDB reads what `status` shows: pending (dead letters
    included), dead letters and the oldest pending message's age."""
    Backlog(mariadb_engine)

    numbers = read_backlog(mariadb_engine)
    report = status_json(capsys, mariadb_engine)

    assert (numbers.pending, numbers.dead) == (report["pending"], report["dead"]) == (9, 1)
    age = numbers.oldest_age_seconds
    assert age - 0.5 <= report["oldest_pending_age_seconds"] <= age + 30


def test_an_empty_outbox_reads_zero_and_none_on_mariadb(
    mariadb_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no unpublished row, status counts 0 and has no oldest age (NULL, not an error),
    and the backlog gauges read 0."""
    set_rows(mariadb_engine, [enqueue_one(mariadb_engine, "archived")], published_at=ago(DAY))

    report = status_json(capsys, mariadb_engine)

    assert (report["pending"], report["due"], report["oldest_pending_age_seconds"]) == (0, 0, None)
    assert read_backlog(mariadb_engine) == BacklogNumbers(0, 0, 0.0)


def test_dead_letters_list_retry_and_discard_through_the_api(mariadb_engine: Engine) -> None:
    """On MariaDB, dead_letters() lists the dead letter as a publisher would receive it, with
    its attempts, whole last error and aware dead_at; retry_dead() of it, a row that is not dead
    and an unknown id retries only it (attempts, backoff and claim reset, last error kept, what
    it parked still parked); discard_dead() with no ids deletes every dead letter, unparks what
    they held back and touches nothing else."""
    backlog = Backlog(mariadb_engine)

    [letter] = outbox.dead_letters(mariadb_engine)

    assert letter.id == backlog.dead.id
    assert (letter.job, letter.ordering_key, letter.attempts) == ("charge_card", "order-7", 5)
    assert letter.message.input == {"job": "charge_card"}
    assert letter.last_error == DEAD_ERROR
    assert letter.dead_at.tzinfo is dt.timezone.utc and letter.dead_at < ago(28 * DAY)

    retried = outbox.retry_dead(
        mariadb_engine, [str(backlog.dead.id), backlog.backing_off.id, uuid.uuid4()]
    )

    assert retried == 1
    row = outbox_row(mariadb_engine, backlog.dead)
    assert (row.dead_at, row.retry_at, row.attempts, row.claimed_by) == (None, None, 0, None)
    assert row.last_error == DEAD_ERROR
    assert outbox_row(mariadb_engine, backlog.parked).parked is True
    assert outbox_row(mariadb_engine, backlog.backing_off).attempts == 1
    assert outbox.dead_letters(mariadb_engine) == []

    set_rows(mariadb_engine, [backlog.dead, backlog.retry_due], dead_at=ago(DAY))
    before = row_ids(mariadb_engine)

    assert outbox.discard_dead(url_text(mariadb_engine)) == 2

    assert row_ids(mariadb_engine) == before - {backlog.dead.id, backlog.retry_due.id}
    assert outbox_row(mariadb_engine, backlog.parked).parked is False
    assert outbox.dead_letters(mariadb_engine) == []


def test_discard_by_id_unparks_only_behind_that_dead_letter(mariadb_engine: Engine) -> None:
    """discard_dead() with ids deletes only those dead letters (an id that is not dead is
    skipped) and unparks only the rows parked behind them, in one transaction."""
    backlog = Backlog(mariadb_engine)
    other = enqueue_one(mariadb_engine, "charge_card", ordering_key="order-8")
    behind_other = enqueue_one(mariadb_engine, "ship_order", ordering_key="order-8")
    set_rows(mariadb_engine, [other], dead_at=ago(DAY), attempts=5)
    set_rows(mariadb_engine, [behind_other], parked=True, parked_behind=other.id)

    assert outbox.discard_dead(mariadb_engine, [backlog.dead.id, backlog.backing_off.id]) == 1

    assert outbox_row(mariadb_engine, backlog.dead) is None
    assert outbox_row(mariadb_engine, backlog.backing_off) is not None
    assert outbox_row(mariadb_engine, backlog.parked).parked is False
    assert outbox_row(mariadb_engine, behind_other).parked is True
    assert [letter.id for letter in outbox.dead_letters(mariadb_engine)] == [other.id]


def test_dead_list_retry_and_discard_through_the_cli(
    mariadb_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sqla-outbox dead` on MariaDB: `list` prints the dead letter (table and --json);
    `retry ID NOT-DEAD` retries the dead letter and exits 1 naming the id that was not one;
    `discard --all` deletes every dead letter and says how many."""
    backlog = Backlog(mariadb_engine)
    url = url_text(mariadb_engine)

    code, out, _ = run_main(capsys, "dead", "list", "--url", url)
    assert code == 0
    assert out.startswith("1 dead letter:\n")
    assert re.search(
        rf"^\s+{backlog.dead.id}\s+charge_card\s+default\s+order-7\s+5\s+\d{{4}}-\d\d-\d\d "
        r"\d\d:\d\d:\d\dZ\s+RuntimeError: card declined$",
        out,
        re.MULTILINE,
    )
    code, out, _ = run_main(capsys, "dead", "list", "--json", "--url", url)
    assert code == 0
    [line] = out.splitlines()
    listed = json.loads(line)
    assert (listed["id"], listed["attempts"], listed["last_error"]) == (
        str(backlog.dead.id),
        5,
        DEAD_ERROR,
    )

    code, out, err = run_main(
        capsys, "dead", "retry", "--url", url, str(backlog.dead.id), str(backlog.parked.id)
    )
    assert code == 1
    assert out.startswith("Retried 1 dead letter;")
    assert "1 id given is not a dead letter (published, retried or discarded already" in err
    assert str(backlog.parked.id) in err
    assert outbox_row(mariadb_engine, backlog.dead).dead_at is None

    set_rows(mariadb_engine, [backlog.dead, backlog.backing_off], dead_at=ago(DAY))
    code, out, _ = run_main(capsys, "dead", "discard", "--all", "--url", url)
    assert code == 0
    assert out.strip() == "Discarded 2 dead letters; they will never be published."
    assert row_ids(mariadb_engine, T.id.in_([backlog.dead.id, backlog.backing_off.id])) == set()
    assert run_main(capsys, "dead", "list", "--url", url)[1].strip() == "No dead letters."


def test_purge_deletes_only_old_published_rows(mariadb_engine: Engine) -> None:
    """outbox.purge(older_than=7 days) on MariaDB deletes the three rows published ten days ago
    and returns 3; the row published yesterday and every unpublished row (the month-old dead
    letter, the lapsed claim, the parked, scheduled and backing-off rows) stay. With
    older_than=12 hours, yesterday's goes too."""
    backlog = Backlog(mariadb_engine)
    kept = backlog.unpublished | {backlog.recent_published.id}

    assert outbox.purge(mariadb_engine, older_than=WEEK) == 3
    assert row_ids(mariadb_engine) == kept
    assert outbox.purge(url_text(mariadb_engine), older_than=WEEK) == 0
    assert outbox.purge(mariadb_engine, older_than=dt.timedelta(hours=12)) == 1
    assert row_ids(mariadb_engine) == backlog.unpublished


def test_purge_goes_batch_by_batch(mariadb_engine: Engine) -> None:
    """The batches on MariaDB delete batch_size rows each, oldest published first, and the purge
    ends with the first short one; a relay's background round stops after max_batches with
    `behind` set, and the next round deletes the rest."""
    old = [enqueue_one(mariadb_engine, "archived") for _ in range(25)]
    for days, message in enumerate(old):
        set_rows(mariadb_engine, [message], published_at=ago((40 - days) * DAY))
    with mariadb_engine.connect() as conn:
        cutoff = retention.purge_cutoff(conn, WEEK)

    batches = retention.purge_batches(mariadb_engine, cutoff, 10, max_batches=1)
    assert list(batches) == [10]
    assert row_ids(mariadb_engine) == {m.id for m in old[10:]}  # the ten oldest went first

    background = retention.BackgroundPurge(
        mariadb_engine, WEEK, relay_id="relay-mysql", batch_size=5, max_batches=2
    )
    assert background.run_round() == 10
    assert background.behind
    assert background.run_round() == 5
    assert not background.behind
    assert row_ids(mariadb_engine) == set()


def test_purge_through_the_cli(mariadb_engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    """`sqla-outbox purge` on MariaDB deletes the rows published longer ago than --older-than,
    in batches of --batch-size, prints how many, and leaves unpublished rows alone."""
    backlog = Backlog(mariadb_engine)
    url = url_text(mariadb_engine)

    code, out, _ = run_main(
        capsys, "purge", "--url", url, "--older-than", "7d", "--batch-size", "2"
    )

    assert code == 0
    assert out.strip() == "Purged 3 published rows older than 7d."
    code, out, _ = run_main(capsys, "purge", "--url", url, "--older-than", "12h")
    assert out.strip() == "Purged 1 published row older than 12h."
    assert row_ids(mariadb_engine) == backlog.unpublished


def test_a_purge_batch_does_not_hold_up_enqueue(mariadb_engine: Engine) -> None:
    """A purge batch that has deleted its rows and not yet committed does not make an enqueue
    wait, at the isolation level purges run at on MySQL (READ COMMITTED). At InnoDB's default
    REPEATABLE READ it would: the batch's next-key locks cover the gap where the new row's NULL
    published_at goes, and the insert gives up after its lock wait (one second here)."""
    old = [enqueue_one(mariadb_engine, "archived") for _ in range(5)]
    set_rows(mariadb_engine, old, published_at=ago(10 * DAY))
    enqueue_one(mariadb_engine, "pending")
    purge = queries.purge_stmt(mariadb_engine.dialect.name)
    params = {"cutoff": ago(WEEK), "limit": 3}

    def enqueue_beside_batch(isolation: str) -> None:
        batch_engine = mariadb_engine.execution_options(isolation_level=isolation)
        with batch_engine.connect() as batch:
            transaction = batch.begin()
            try:
                assert batch.execute(purge, params).rowcount == 3
                with mariadb_engine.connect() as app:
                    app.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
                    app.commit()
                    with app.begin():
                        outbox.enqueue(app, "send_receipt", {"during": isolation})
            finally:
                transaction.rollback()

    enqueue_beside_batch(MySQLOperations.purge_isolation)
    with pytest.raises(sa.exc.OperationalError, match="Lock wait timeout"):
        enqueue_beside_batch("REPEATABLE READ")


# --- statements a MySQL relay will run ---------------------------------------------------------


def test_sweep_and_idle_statements_run_on_mariadb(mariadb_engine: Engine) -> None:
    """The parked-row sweep unparks a parked row that names no stuck row and keeps the one
    parked behind the dead letter; the idle query reads the next scheduled run, the earliest
    retry of a row no claim holds (one already due included), the oldest claim and the parked
    count, with aware UTC timestamps."""
    backlog = Backlog(mariadb_engine)
    free = enqueue_one(mariadb_engine, "ship_order", ordering_key="order-9")
    set_rows(mariadb_engine, [free], parked=True)
    dialect = mariadb_engine.dialect.name
    now = dt.datetime.now(dt.timezone.utc)

    relay = outbox.Relay(mariadb_engine, lambda message: None)
    store = relay._statements  # the held-row part of a sweep only: it reads, then unparks
    try:
        with store._transaction(statements=2) as conn:
            assert store._unpark_free(conn, store._sweep_params()) == 1
    finally:
        relay.close()
    assert outbox_row(mariadb_engine, free).parked is False
    assert outbox_row(mariadb_engine, backlog.parked).parked is True

    with mariadb_engine.connect() as conn:
        idle = conn.execute(queries.idle_stmt(dialect), {"now": now}).one()
    assert idle.next_run_at == outbox_row(mariadb_engine, backlog.scheduled).run_at
    # The failed row whose backoff is over is due now: the earliest retry, in the past.
    assert idle.next_retry_at == outbox_row(mariadb_engine, backlog.retry_due).retry_at
    assert idle.next_retry_at < now
    assert idle.oldest_claim == outbox_row(mariadb_engine, backlog.lapsed).claimed_at
    assert idle.parked == 1
    assert idle.now.tzinfo is dt.timezone.utc


def _rows_read(plan: Any) -> int:
    """Rows every table access of a MariaDB ``ANALYZE FORMAT=JSON`` plan read, over its loops."""
    if isinstance(plan, list):
        return sum(map(_rows_read, plan))
    if not isinstance(plan, dict):
        return 0
    read = 0
    if "table_name" in plan and plan.get("r_rows") is not None:  # null: never read
        read += round(float(plan["r_rows"]) * float(plan.get("r_loops") or 1))
    return read + sum(_rows_read(value) for value in plan.values())


def test_a_mark_unparks_reading_only_its_own_transactions_and_keys(mariadb_engine: Engine) -> None:
    """960 parked rows (40 keys of 25, behind 40 dead letters), and 50 other messages being
    marked: unparking the rows parked behind the 50 (none) reads their entries of
    ix_outbox_parked_behind, not the parked rows; with statistics as InnoDB keeps them."""
    parked_total = 40 * 24
    with mariadb_engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox (id, job, queue, input, idempotency_key, max_attempts, run_at, "
            "staged_at, ordering_key, attempts, dead_at, parked) "
            "SELECT UNHEX(REPLACE(UUID(), '-', '')), 'held', 'default', '{}', UUID(), 3, "
            "NOW(6), NOW(6) - INTERVAL 1 HOUR + INTERVAL seq MICROSECOND, "
            "CONCAT('key-', seq MOD 40), IF(seq < 40, 3, 0), IF(seq < 40, NOW(6), NULL), "
            "seq >= 40 FROM seq_0_to_999"
        )
        conn.exec_driver_sql("ANALYZE TABLE outbox")
    holders = [enqueue_one(mariadb_engine, f"m{n}") for n in range(50)]
    with mariadb_engine.connect() as conn:

        @sa.event.listens_for(conn, "before_cursor_execute", retval=True)
        def analyze(*args: Any) -> tuple[str, Any]:
            return f"ANALYZE FORMAT=JSON {args[2]}", args[3]

        plan = json.loads(
            conn.execute(
                queries.unpark_behind_stmt(mariadb_engine.dialect.name),
                {"ids": [m.id for m in holders]},
            ).scalar_one()
        )
        conn.rollback()
    with mariadb_engine.connect() as conn:
        still = conn.execute(sa.select(sa.func.count()).where(T.parked)).scalar_one()
    assert still == parked_total
    assert _rows_read(plan) <= 4 * len(holders), _rows_read(plan)


@pytest.mark.parametrize(
    ("name", "statement", "derived"),
    [
        (
            "purge",
            lambda: queries.purge_stmt("mysql"),
            "DELETE FROM outbox USING outbox, (SELECT outbox.id AS id FROM outbox WHERE "
            "outbox.published_at < %s ORDER BY outbox.published_at LIMIT %s) AS oldest "
            "WHERE outbox.id = oldest.id",
        ),
        (
            "unpark",
            lambda: queries.unpark_behind_stmt("mysql"),
            "UPDATE outbox SET parked=false, parked_behind=NULL "
            "WHERE outbox.parked_behind IN (__[POSTCOMPILE_ids])",
        ),
    ],
)
def test_mysql_statements_read_the_table_they_change_through_derived_tables(
    name: str, statement: Any, derived: str
) -> None:
    """MySQL refuses a subquery on the table an UPDATE or DELETE changes (error 1093, which
    MariaDB 10.3+ allows, so the MariaDB tests cannot catch it) and a LIMIT inside IN (...)
    (error 1235), unless the subquery reads a derived table it materializes: the purge reads
    the outbox only through one, kept from being merged back by its LIMIT; the unparking
    behind holders names its rows by ``parked_behind``, no subquery. (A sweep reads the rows
    it unparks first, then changes them by primary key.)"""
    sql = " ".join(str(statement().compile(dialect=mysql.dialect())).split())
    assert derived in sql
    # No "x IN (SELECT ... FROM outbox ...)" (a word of its own: "JOIN (SELECT" is allowed).
    assert not re.search(r"\bIN \(SELECT (outbox|holder|parked_row)\.", sql), sql


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite", "mysql", "mariadb"])
def test_operator_statements_use_one_portable_spelling(dialect: str) -> None:
    """status, the backlog gauges and the idle query count and take minima with CASE, never
    FILTER (WHERE ...), which MySQL and MariaDB lack; on MySQL and MariaDB the UPDATE and DELETE
    of the dead-letter operations return nothing (no RETURNING there), elsewhere their ids."""
    compile_for = {
        "postgresql": PGDialect_psycopg(),  # type: ignore[no-untyped-call]
        "sqlite": SQLiteDialect_pysqlite(),
        "mysql": mysql.dialect(),
        "mariadb": MariaDBDialect(),
    }[dialect]
    for stmt in (queries.status_stmt, queries.backlog_stmt, queries.idle_stmt):
        assert "FILTER" not in str(stmt(dialect).compile(dialect=compile_for))
    returning = dialect not in ("mysql", "mariadb")
    for ids in (True, False):
        for change in (
            queries.retry_dead_stmt(dialect, ids=ids),
            queries.delete_dead_stmt(dialect, ids=ids),
        ):
            assert ("RETURNING" in str(change.compile(dialect=compile_for))) is returning


# --- the relay (its store: tests/stores runs the whole conformance suite on MariaDB) ----------


def test_a_relay_publishes_what_was_staged_in_order(db: Engine) -> None:
    """Relay(...) on a MariaDB engine drains what enqueue committed, in claim order, and marks
    every row published with the database's microseconds."""
    staged = [enqueue_one(db, f"job{n}") for n in range(5)]
    published: list[str] = []
    with outbox.Relay(db, lambda message: published.append(message.job), batch_size=2) as relay:
        result = relay.drain()
    assert result.published == 5
    assert published == [message.job for message in staged]
    with Session(db) as session:
        assert session.scalar(sa.select(sa.func.count()).where(T.published_at.is_(None))) == 0


def test_cli_relay_once_on_mariadb(db: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    """`sqla-outbox relay --once` on a MariaDB URL publishes the backlog and exits 0."""
    staged = [enqueue_one(db, f"job{n}") for n in range(3)]

    code, out, err = run_main(
        capsys, "relay", "--url", url_text(db), "--publisher", "stdout", "--once"
    )

    assert code == 0, err
    assert [json.loads(line)["id"] for line in out.splitlines()] == [str(m.id) for m in staged]
