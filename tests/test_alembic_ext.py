"""alembic_ext: ``op.create_outbox_table()``/``op.drop_outbox_table()`` and autogenerate support.

Every test runs against a real database (a fresh PostgreSQL database or SQLite file per test) or,
for offline mode, Alembic's real SQL renderer; nothing is mocked.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata, produce_migrations, render_python_code
from alembic.config import Config
from alembic.operations import Operations, ops
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import alembic_ext
import sqla_outbox as outbox
from alembic_ext import CreateOutboxTableOp, DropOutboxTableOp
from sqla_outbox.engines import create_engine

EXAMPLE_INI = Path(__file__).resolve().parent.parent / "examples" / "alembic" / "alembic.ini"

#: The strictest comparison Alembic offers; the outbox must produce no diffs even with it.
COMPARE_OPTS: dict[str, Any] = {"compare_type": True, "compare_server_default": True}

INDEX_WHERE = "published_at IS NULL"
INDEX_WHERE_SQL = f"WHERE {INDEX_WHERE}"


def make_app_metadata() -> MetaData:
    """A stand-in for an application's models: one business table, ``orders``."""
    app_metadata = MetaData()
    Table(
        "orders",
        app_metadata,
        Column("id", Integer, primary_key=True),
        Column("customer", String(255), nullable=False),
    )
    return app_metadata


def autogenerate(
    conn: sa.Connection, target: MetaData | list[MetaData], **opts: Any
) -> ops.MigrationScript:
    """``produce_migrations`` as ``alembic revision --autogenerate`` runs it, with strict compares.

    Returns the ``MigrationScript``. A list of ``MetaData`` is what ``env.py``'s
    ``target_metadata`` takes and what ``produce_migrations`` accepts at runtime; its annotation
    only names a single ``MetaData``, hence the cast.
    """
    ctx = MigrationContext.configure(conn, opts={**COMPARE_OPTS, **opts})
    return produce_migrations(ctx, cast(MetaData, target))


def rendered(script: ops.MigrationScript) -> tuple[str, str]:
    """The Python that autogenerate would write for ``upgrade()`` and ``downgrade()``."""
    assert script.upgrade_ops is not None
    assert script.downgrade_ops is not None
    return render_python_code(script.upgrade_ops), render_python_code(script.downgrade_ops)


def operations(conn: sa.Connection) -> Any:
    """Alembic's ``op`` bound to ``conn``.

    Typed ``Any`` because ``create_outbox_table``/``drop_outbox_table`` are attached to
    ``Operations`` at runtime by ``import alembic_ext``, which no type checker can see.
    """
    return Operations(MigrationContext.configure(conn))


@pytest.fixture
def pg_empty(pg_url: URL) -> Iterator[Engine]:
    """An engine on a fresh PostgreSQL database with no tables at all."""
    engine = create_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_empty(sqlite_url: URL) -> Iterator[Engine]:
    """An engine on a fresh SQLite file with no tables at all."""
    engine = create_engine(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def empty_engine(request: pytest.FixtureRequest) -> Engine:
    """The same test on an empty PostgreSQL database and an empty SQLite file."""
    name = "pg_empty" if request.param == "postgresql" else "sqlite_empty"
    engine: Engine = request.getfixturevalue(name)
    return engine


def example_config(url: URL) -> Config:
    """A ``Config`` for ``examples/alembic`` pinned to ``url``, leaving the host's logging alone."""
    cfg = Config(str(EXAMPLE_INI))
    # configparser interpolates '%', which may appear in an escaped password.
    cfg.set_main_option(
        "sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%")
    )
    cfg.attributes["configure_logging"] = False
    return cfg


def index_sql(conn: sa.Connection) -> str:
    """The partial index's definition as the database stores it."""
    if conn.dialect.name == "postgresql":
        query = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_outbox_unpublished'"
    else:
        query = "SELECT sql FROM sqlite_master WHERE name = 'ix_outbox_unpublished'"
    return str(conn.execute(text(query)).scalar_one())


# --- operations against real databases -------------------------------------------------------


def test_create_outbox_table_on_postgresql_matches_the_model(pg_empty: Engine) -> None:
    """On PostgreSQL, op.create_outbox_table() builds exactly the model: autogenerate (types and
    server defaults compared) finds nothing to change, the index is partial on
    (staged_at, id) WHERE published_at IS NULL, fillfactor is 50; op.drop_outbox_table() then
    leaves neither table nor index behind."""
    with pg_empty.begin() as conn:
        operations(conn).create_outbox_table()

    with pg_empty.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=COMPARE_OPTS)
        assert compare_metadata(ctx, outbox.metadata) == []
        indexdef = index_sql(conn)
        assert "(staged_at, id)" in indexdef
        assert f"WHERE ({INDEX_WHERE})" in indexdef
        reloptions = conn.execute(
            text("SELECT reloptions FROM pg_class WHERE relname = 'outbox'")
        ).scalar_one()
        assert reloptions == ["fillfactor=50"]

    with pg_empty.begin() as conn:
        operations(conn).drop_outbox_table()

    inspector = inspect(pg_empty)
    assert inspector.get_table_names() == []
    with pg_empty.connect() as conn:
        leftover = conn.execute(
            text("SELECT indexname FROM pg_indexes WHERE indexname LIKE '%outbox%'")
        ).all()
    assert leftover == []


def test_create_outbox_table_on_sqlite_matches_the_model(sqlite_empty: Engine) -> None:
    """On SQLite, op.create_outbox_table() builds exactly the model (no autogenerate diffs, partial
    index with its WHERE clause), and op.drop_outbox_table() removes table and index."""
    with sqlite_empty.begin() as conn:
        operations(conn).create_outbox_table()

    with sqlite_empty.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=COMPARE_OPTS)
        assert compare_metadata(ctx, outbox.metadata) == []
        assert f"WHERE {INDEX_WHERE}" in index_sql(conn)

    with sqlite_empty.begin() as conn:
        operations(conn).drop_outbox_table()

    inspector = inspect(sqlite_empty)
    assert inspector.get_table_names() == []
    with sqlite_empty.connect() as conn:
        leftover = conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'index'")).all()
    assert leftover == []


def test_create_outbox_table_in_a_schema(pg_empty: Engine) -> None:
    """op.create_outbox_table(schema="jobs") puts the table and its index in that schema and
    nowhere else; a target metadata with the outbox moved to "jobs" then compares clean, and
    op.drop_outbox_table(schema="jobs") removes it again."""
    with pg_empty.begin() as conn:
        conn.execute(text("CREATE SCHEMA jobs"))
        operations(conn).create_outbox_table(schema="jobs")

    inspector = inspect(pg_empty)
    assert inspector.get_table_names(schema="jobs") == ["outbox"]
    assert inspector.get_table_names() == []
    assert [ix["name"] for ix in inspector.get_indexes("outbox", schema="jobs")] == [
        "ix_outbox_unpublished"
    ]
    with pg_empty.connect() as conn:
        schemas = conn.execute(
            text("SELECT schemaname FROM pg_indexes WHERE indexname = 'ix_outbox_unpublished'")
        ).scalars()
        assert list(schemas) == ["jobs"]

        jobs_metadata = MetaData()
        outbox.metadata.tables["outbox"].to_metadata(jobs_metadata, schema="jobs")
        ctx = MigrationContext.configure(conn, opts={**COMPARE_OPTS, "include_schemas": True})
        assert compare_metadata(ctx, jobs_metadata) == []

    with pg_empty.begin() as conn:
        operations(conn).drop_outbox_table(schema="jobs")
    assert inspect(pg_empty).get_table_names(schema="jobs") == []


# --- operation objects and offline mode --------------------------------------------------------


def test_reverse_of_each_op_is_the_other() -> None:
    """create.reverse() is a drop and drop.reverse() a create, schema preserved, so autogenerate
    writes the downgrade of either without help."""
    create = CreateOutboxTableOp(schema="jobs")
    drop = create.reverse()
    assert isinstance(drop, DropOutboxTableOp)
    assert drop.schema == "jobs"
    again = drop.reverse()
    assert isinstance(again, CreateOutboxTableOp)
    assert again.schema == "jobs"
    assert isinstance(DropOutboxTableOp().reverse(), CreateOutboxTableOp)
    assert CreateOutboxTableOp().reverse().schema is None


@pytest.mark.parametrize(
    ("dialect", "where"),
    [("postgresql", f"WHERE {INDEX_WHERE}"), ("sqlite", f"WHERE {INDEX_WHERE}")],
)
def test_offline_sql_mode_emits_the_ddl(dialect: str, where: str) -> None:
    """In offline (--sql) mode the operations print CREATE TABLE outbox and the partial
    CREATE INDEX ix_outbox_unpublished (and DROP INDEX/DROP TABLE), touching no database."""
    buffer = io.StringIO()
    ctx = MigrationContext.configure(
        dialect_name=dialect, opts={"as_sql": True, "output_buffer": buffer}
    )
    op: Any = Operations(ctx)
    op.create_outbox_table()
    op.drop_outbox_table()
    sql = buffer.getvalue()

    assert "CREATE TABLE outbox (" in sql
    assert "CONSTRAINT pk_outbox PRIMARY KEY (id)" in sql
    assert f"CREATE INDEX ix_outbox_unpublished ON outbox (staged_at, id) {where}" in sql
    assert sql.count("CREATE INDEX") == 1  # impl.create_table already emits the table's indexes
    assert "DROP INDEX ix_outbox_unpublished" in sql
    assert "DROP TABLE outbox" in sql
    assert sql.index("CREATE TABLE outbox") < sql.index("CREATE INDEX ix_outbox_unpublished")
    assert sql.index("DROP INDEX ix_outbox_unpublished") < sql.index("DROP TABLE outbox")
    if dialect == "postgresql":
        assert "SET (fillfactor = 50)" in sql


def test_offline_sql_mode_in_a_schema() -> None:
    """Offline, schema="jobs" qualifies the table and the index's table."""
    buffer = io.StringIO()
    ctx = MigrationContext.configure(
        dialect_name="postgresql", opts={"as_sql": True, "output_buffer": buffer}
    )
    op: Any = Operations(ctx)
    op.create_outbox_table(schema="jobs")
    sql = buffer.getvalue()
    assert "CREATE TABLE jobs.outbox (" in sql
    assert "CREATE INDEX ix_outbox_unpublished ON jobs.outbox (staged_at, id)" in sql


# --- autogenerate --------------------------------------------------------------------------------


def test_autogenerate_writes_create_outbox_table(empty_engine: Engine) -> None:
    """With target metadata [app_metadata, outbox.metadata] on an empty database, autogenerate
    renders the business table as op.create_table but the outbox as op.create_outbox_table()
    (no raw create_table('outbox') nor its create_index), with op.drop_outbox_table() in the
    downgrade; once both tables exist it produces no operations at all."""
    app_metadata = make_app_metadata()
    target = [app_metadata, outbox.metadata]

    with empty_engine.connect() as conn:
        upgrade, downgrade = rendered(autogenerate(conn, target))

    assert "op.create_outbox_table()" in upgrade
    assert "create_table('outbox'" not in upgrade
    assert "create_index" not in upgrade
    assert "op.create_table('orders'" in upgrade
    assert "op.drop_outbox_table()" in downgrade
    assert "drop_table('outbox'" not in downgrade
    assert "op.drop_table('orders')" in downgrade

    with empty_engine.begin() as conn:
        app_metadata.create_all(conn)
        operations(conn).create_outbox_table()

    with empty_engine.connect() as conn:
        script = autogenerate(conn, target)
    assert script.upgrade_ops is not None
    assert script.upgrade_ops.is_empty()


def test_compare_metadata_reports_the_missing_outbox_as_one_added_table(pg_empty: Engine) -> None:
    """compare_metadata (the diff-tuple API, also behind `alembic check`) still works after the
    rewrite: a missing outbox is reported as a single ("add_table", <outbox Table>) diff."""
    with pg_empty.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=COMPARE_OPTS)
        diffs = compare_metadata(ctx, outbox.metadata)
    assert len(diffs) == 1
    kind, table = diffs[0]
    assert kind == "add_table"
    assert table.name == "outbox"


def test_autogenerate_in_a_schema_renders_the_schema(pg_empty: Engine) -> None:
    """An outbox moved to schema "jobs" in the target metadata autogenerates as
    op.create_outbox_table(schema='jobs'); schema= is rendered only when there is one."""
    with pg_empty.begin() as conn:
        conn.execute(text("CREATE SCHEMA jobs"))
    jobs_metadata = MetaData()
    outbox.metadata.tables["outbox"].to_metadata(jobs_metadata, schema="jobs")

    with pg_empty.connect() as conn:
        upgrade, downgrade = rendered(autogenerate(conn, jobs_metadata, include_schemas=True))
    assert "op.create_outbox_table(schema='jobs')" in upgrade
    assert "op.drop_outbox_table(schema='jobs')" in downgrade


def test_autogenerate_writes_drop_outbox_table_when_removed(empty_engine: Engine) -> None:
    """An outbox table in the database but no longer in the target metadata autogenerates as
    op.drop_outbox_table() (no separate drop_index), and its downgrade as
    op.create_outbox_table(), not a reflected copy of the columns."""
    with empty_engine.begin() as conn:
        operations(conn).create_outbox_table()

    with empty_engine.connect() as conn:
        upgrade, downgrade = rendered(autogenerate(conn, make_app_metadata()))
    assert "op.drop_outbox_table()" in upgrade
    assert "drop_index" not in upgrade
    assert "drop_table('outbox'" not in upgrade
    assert "op.create_outbox_table()" in downgrade
    assert "create_table('outbox'" not in downgrade


def test_autogenerate_leaves_an_unrelated_outbox_table_alone(empty_engine: Engine) -> None:
    """An application table that is merely *named* outbox (different columns) is not the
    library's outbox: autogenerate keeps Alembic's op.create_table('outbox', ...) for it."""
    app_metadata = MetaData()
    Table("outbox", app_metadata, Column("id", Integer, primary_key=True), Column("body", String))
    assert not alembic_ext.is_outbox_table(app_metadata.tables["outbox"])

    with empty_engine.connect() as conn:
        upgrade, _ = rendered(autogenerate(conn, app_metadata))
    assert "op.create_table('outbox'" in upgrade
    assert "create_outbox_table" not in upgrade


# --- the example environment, through Alembic's command API ----------------------------------


def test_example_revision_autogenerate_writes_create_outbox_table(
    pg_empty: Engine, pg_url: URL, tmp_path: Path
) -> None:
    """`alembic revision --autogenerate` with examples/alembic's env.py (which only imports
    alembic_ext and lists outbox.metadata) writes a migration calling op.create_outbox_table()
    that imports alembic_ext itself, next to op.create_table('orders', ...)."""
    cfg = example_config(pg_url)
    cfg.set_main_option("version_locations", str(tmp_path))
    command.revision(cfg, message="initial", autogenerate=True, version_path=str(tmp_path))

    [migration] = tmp_path.glob("*.py")
    source = migration.read_text()
    assert "import alembic_ext" in source
    assert "op.create_outbox_table()" in source
    assert "op.drop_outbox_table()" in source
    assert "op.create_table('orders'" in source
    assert "create_table('outbox'" not in source
    assert "create_index" not in source


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_example_upgrade_check_downgrade(backend: str, request: pytest.FixtureRequest) -> None:
    """examples/alembic end to end: `upgrade head` creates orders and outbox, `alembic check`
    then finds nothing to generate, and `downgrade base` removes both tables."""
    url: URL = request.getfixturevalue("pg_url" if backend == "postgresql" else "sqlite_url")
    cfg = example_config(url)
    engine = create_engine(url)
    try:
        command.upgrade(cfg, "head")
        tables = set(inspect(engine).get_table_names())
        assert {"orders", "outbox"} <= tables

        command.check(cfg)  # raises AutogenerateDiffsDetected on any pending change

        command.downgrade(cfg, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()


def test_example_offline_upgrade_prints_the_outbox_ddl() -> None:
    """`alembic upgrade head --sql` through the example env prints the outbox's CREATE TABLE and
    partial CREATE INDEX without connecting to any database."""
    buffer = io.StringIO()
    cfg = Config(str(EXAMPLE_INI), output_buffer=buffer)
    cfg.set_main_option("sqlalchemy.url", "postgresql+psycopg://nobody@invalid.invalid/none")
    cfg.attributes["configure_logging"] = False
    command.upgrade(cfg, "head", sql=True)
    sql = buffer.getvalue()
    assert "CREATE TABLE orders" in sql
    assert "CREATE TABLE outbox (" in sql
    assert f"CREATE INDEX ix_outbox_unpublished ON outbox (staged_at, id) {INDEX_WHERE_SQL}" in sql


# --- generated migrations run on their own, in fresh processes -------------------------------

ENV_PY = '''\
"""A minimal env.py; whether it imports alembic_ext is the test's variable."""
import sys

from alembic import context
from sqlalchemy import create_engine, pool

{import_line}
import sqla_outbox as outbox

assert ("alembic_ext" in sys.modules) is {expect_loaded}, sorted(sys.modules)

engine = create_engine(context.config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(
        connection=connection, target_metadata=outbox.metadata, compare_type=True
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
'''


def write_env(directory: Path, url: URL, *, import_alembic_ext: bool) -> Path:
    """An Alembic environment in ``directory`` migrating ``url``; returns its ``alembic.ini``."""
    (directory / "versions").mkdir(parents=True, exist_ok=True)
    (directory / "script.py.mako").write_text((EXAMPLE_INI.parent / "script.py.mako").read_text())
    (directory / "env.py").write_text(
        ENV_PY.format(
            import_line="import alembic_ext" if import_alembic_ext else "",
            expect_loaded=import_alembic_ext,
        )
    )
    ini = directory / "alembic.ini"
    rendered_url = url.render_as_string(hide_password=False).replace("%", "%%")
    ini.write_text(f"[alembic]\nscript_location = {directory}\nsqlalchemy.url = {rendered_url}\n")
    return ini


def alembic_cli(ini: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``alembic -c ini ARGS`` in a fresh interpreter: nothing this test process imported (such
    as alembic_ext) is loaded there unless env.py or the migration imports it."""
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def insert_one_message(engine: Engine) -> None:
    """Stage and commit one message through the library: the table works for the outbox."""
    with Session(engine) as session:
        outbox.enqueue(session, "send_receipt", {"order_id": 1})
        session.commit()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT job FROM outbox")).scalars().all() == ["send_receipt"]


def test_generated_migration_runs_under_an_env_without_alembic_ext(
    pg_url: URL, pg_empty: Engine, tmp_path: Path
) -> None:
    """A migration autogenerated with alembic_ext loaded imports alembic_ext itself, so `alembic
    upgrade head` runs it from an env.py that never imports alembic_ext (fresh processes for
    both steps); the table it creates takes an enqueued message."""
    generate = write_env(tmp_path / "generate", pg_url, import_alembic_ext=True)
    result = alembic_cli(generate, "revision", "--autogenerate", "-m", "outbox")
    assert result.returncode == 0, result.stderr
    [migration] = (tmp_path / "generate" / "versions").glob("*.py")
    source = migration.read_text()
    assert "import alembic_ext" in source
    assert "op.create_outbox_table()" in source

    upgrade = write_env(tmp_path / "upgrade", pg_url, import_alembic_ext=False)
    (tmp_path / "upgrade" / "versions" / migration.name).write_text(source)
    result = alembic_cli(upgrade, "upgrade", "head")
    assert result.returncode == 0, result.stderr
    insert_one_message(pg_empty)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "Without alembic_ext loaded, Alembic writes the outbox column by column with "
        "sqla_outbox.model.UTCDateTime(timezone=True) and imports only sa/postgresql, so the "
        "migration fails with NameError: name 'sqla_outbox' is not defined. Alembic renders any "
        "type outside SQLAlchemy as <module>.<repr> with no import (render_item and "
        "user_module_prefix are env.py settings), and an alembic.plugins entry point cannot "
        "register a default-on comparator (Alembic loads plugins before its global comparator "
        "registry exists). env.py must import alembic_ext; see the README."
    ),
)
def test_migration_autogenerated_without_alembic_ext_runs(
    pg_url: URL, pg_empty: Engine, tmp_path: Path
) -> None:
    """Known gap, pinned: an env.py that forgets `import alembic_ext` autogenerates a migration
    that should still upgrade a fresh PostgreSQL database to a working outbox table."""
    ini = write_env(tmp_path, pg_url, import_alembic_ext=False)
    result = alembic_cli(ini, "revision", "--autogenerate", "-m", "outbox")
    assert result.returncode == 0, result.stderr
    result = alembic_cli(ini, "upgrade", "head")
    assert result.returncode == 0, result.stderr
    insert_one_message(pg_empty)
