"""Table versions: each released version frozen, the mapped table built from the newest, the
database's version read back, and an older table refused with the migration that fixes it.

The released definitions are copied below *literally*, as the declarative classes they were
released as (version 1: ``git show 70e9b84~1:sqla_outbox/model.py``; version 2: as first written
for the ordering/dead-letter release; version 3: as first written for the retention release;
version 4: as first written for the release that parks rows until they are due; version 5: as
first written for the release whose parked rows name the row they wait for).
They are the record the frozen versions in :mod:`sqla_outbox.versions` must keep matching: never
update them to follow the code.
Database tests run on a fresh PostgreSQL database and SQLite file each.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    JSON,
    Boolean,
    Engine,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    Uuid,
    false,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.schema import CreateIndex, CreateTable
from support import MakeRelay

import alembic_ext  # noqa: F401 - registers op.create_outbox_table
import sqla_outbox as outbox
from sqla_outbox import versions
from sqla_outbox.engines import create_engine
from sqla_outbox.model import UTCDateTime
from sqla_outbox.preflight import RELAY_PRIVILEGES, check_outbox_table
from sqla_outbox.schema_errors import (
    missing_column,
    raise_if_missing_table,
    raise_if_outdated_table,
)

DIALECTS = {"postgresql": postgresql.dialect(), "sqlite": sqlite.dialect()}

CURRENT = versions.SCHEMA_VERSION
"""The version this release needs: the one every fix names as the target."""


def pg_fix(found: int) -> str:
    """The sentence the start-up check raises on PostgreSQL for a table of version ``found``."""
    return (
        f"Table 'public.outbox' is schema version {found}; this sqla-outbox needs version "
        f"{CURRENT}. Add a migration with op.upgrade_outbox_table({found}, {CURRENT}) and run "
        "alembic upgrade head."
    )


PG_FIX = pg_fix(1)
SQLITE_FIX = PG_FIX.replace("'public.outbox'", "'outbox'")
PG_FIX_2 = pg_fix(2)
SQLITE_FIX_2 = PG_FIX_2.replace("'public.outbox'", "'outbox'")
PG_FIX_3 = pg_fix(3)
SQLITE_FIX_3 = PG_FIX_3.replace("'public.outbox'", "'outbox'")
PG_FIX_4 = pg_fix(4)
SQLITE_FIX_4 = PG_FIX_4.replace("'public.outbox'", "'outbox'")

# --- the released definitions, copied literally ------------------------------------------------

_JSON = JSON().with_variant(JSONB(), "postgresql")


class _ReleasedV1Base(DeclarativeBase):
    metadata = MetaData()


class ReleasedV1(_ReleasedV1Base):
    """Version 1 exactly as released (the declarative class of sqla_outbox/model.py then)."""

    __tablename__ = "outbox"
    __table_args__ = (
        PrimaryKeyConstraint("id", name="pk_outbox"),
        Index(
            "ix_outbox_unpublished",
            "staged_at",
            "id",
            postgresql_where=text("published_at IS NULL"),
            sqlite_where=text("published_at IS NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid(), primary_key=True)
    job: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(255), server_default="default")
    input: Mapped[Any] = mapped_column(_JSON)
    idempotency_key: Mapped[str] = mapped_column(String(255))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    run_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    staged_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    tenant_id: Mapped[str | None] = mapped_column(String(255))
    traceparent: Mapped[str | None] = mapped_column(String(55))
    enqueued_by: Mapped[str | None] = mapped_column(String(255))
    claimed_by: Mapped[str | None] = mapped_column(String(255))
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    published_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)


def _partial(name: str, where: str, *columns: str) -> Index:
    return Index(name, *columns, postgresql_where=text(where), sqlite_where=text(where))


class _WrittenV2Base(DeclarativeBase):
    metadata = MetaData()


class WrittenV2(_WrittenV2Base):
    """Version 2 as first written (version 1 plus four columns and five partial indexes)."""

    __tablename__ = "outbox"
    __table_args__ = (
        PrimaryKeyConstraint("id", name="pk_outbox"),
        Index(
            "ix_outbox_unpublished",
            "staged_at",
            "id",
            postgresql_where=text("published_at IS NULL"),
            sqlite_where=text("published_at IS NULL"),
        ),
        _partial(
            "ix_outbox_claimable",
            "published_at IS NULL AND dead_at IS NULL AND NOT parked",
            "staged_at",
            "id",
        ),
        _partial(
            "ix_outbox_key",
            "published_at IS NULL AND ordering_key IS NOT NULL",
            "ordering_key",
            "staged_at",
            "id",
        ),
        _partial("ix_outbox_failing", "published_at IS NULL AND attempts > 0", "staged_at", "id"),
        _partial("ix_outbox_parked_group", "parked", "staged_at"),
        _partial("ix_outbox_parked_key", "parked", "ordering_key"),
        {"comment": "sqla-outbox schema 2"},
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid(), primary_key=True)
    job: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(255), server_default="default")
    input: Mapped[Any] = mapped_column(_JSON)
    idempotency_key: Mapped[str] = mapped_column(String(255))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    run_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    staged_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    tenant_id: Mapped[str | None] = mapped_column(String(255))
    traceparent: Mapped[str | None] = mapped_column(String(55))
    enqueued_by: Mapped[str | None] = mapped_column(String(255))
    claimed_by: Mapped[str | None] = mapped_column(String(255))
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    published_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)
    ordering_key: Mapped[str | None] = mapped_column(String(255))
    retry_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    dead_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    parked: Mapped[bool] = mapped_column(Boolean, server_default=false())


class _WrittenV3Base(DeclarativeBase):
    metadata = MetaData()


class WrittenV3(_WrittenV3Base):
    """Version 3 as first written (version 2 plus one partial index over the published rows)."""

    __tablename__ = "outbox"
    __table_args__ = (
        PrimaryKeyConstraint("id", name="pk_outbox"),
        Index(
            "ix_outbox_unpublished",
            "staged_at",
            "id",
            postgresql_where=text("published_at IS NULL"),
            sqlite_where=text("published_at IS NULL"),
        ),
        _partial(
            "ix_outbox_claimable",
            "published_at IS NULL AND dead_at IS NULL AND NOT parked",
            "staged_at",
            "id",
        ),
        _partial(
            "ix_outbox_key",
            "published_at IS NULL AND ordering_key IS NOT NULL",
            "ordering_key",
            "staged_at",
            "id",
        ),
        _partial("ix_outbox_failing", "published_at IS NULL AND attempts > 0", "staged_at", "id"),
        _partial("ix_outbox_parked_group", "parked", "staged_at"),
        _partial("ix_outbox_parked_key", "parked", "ordering_key"),
        _partial("ix_outbox_published", "published_at IS NOT NULL", "published_at"),
        {"comment": "sqla-outbox schema 3"},
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid(), primary_key=True)
    job: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(255), server_default="default")
    input: Mapped[Any] = mapped_column(_JSON)
    idempotency_key: Mapped[str] = mapped_column(String(255))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    run_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    staged_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    tenant_id: Mapped[str | None] = mapped_column(String(255))
    traceparent: Mapped[str | None] = mapped_column(String(55))
    enqueued_by: Mapped[str | None] = mapped_column(String(255))
    claimed_by: Mapped[str | None] = mapped_column(String(255))
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    published_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)
    ordering_key: Mapped[str | None] = mapped_column(String(255))
    retry_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    dead_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    parked: Mapped[bool] = mapped_column(Boolean, server_default=false())


class _WrittenV4Base(DeclarativeBase):
    metadata = MetaData()


class WrittenV4(_WrittenV4Base):
    """Version 4 as first written (version 3 plus the column wake_at and one partial index over
    the rows that have one)."""

    __tablename__ = "outbox"
    __table_args__ = (
        PrimaryKeyConstraint("id", name="pk_outbox"),
        Index(
            "ix_outbox_unpublished",
            "staged_at",
            "id",
            postgresql_where=text("published_at IS NULL"),
            sqlite_where=text("published_at IS NULL"),
        ),
        _partial(
            "ix_outbox_claimable",
            "published_at IS NULL AND dead_at IS NULL AND NOT parked",
            "staged_at",
            "id",
        ),
        _partial(
            "ix_outbox_key",
            "published_at IS NULL AND ordering_key IS NOT NULL",
            "ordering_key",
            "staged_at",
            "id",
        ),
        _partial("ix_outbox_failing", "published_at IS NULL AND attempts > 0", "staged_at", "id"),
        _partial("ix_outbox_parked_group", "parked", "staged_at"),
        _partial("ix_outbox_parked_key", "parked", "ordering_key"),
        _partial("ix_outbox_published", "published_at IS NOT NULL", "published_at"),
        _partial("ix_outbox_waking", "wake_at IS NOT NULL", "wake_at"),
        {"comment": "sqla-outbox schema 4"},
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid(), primary_key=True)
    job: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(255), server_default="default")
    input: Mapped[Any] = mapped_column(_JSON)
    idempotency_key: Mapped[str] = mapped_column(String(255))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    run_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    staged_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    tenant_id: Mapped[str | None] = mapped_column(String(255))
    traceparent: Mapped[str | None] = mapped_column(String(55))
    enqueued_by: Mapped[str | None] = mapped_column(String(255))
    claimed_by: Mapped[str | None] = mapped_column(String(255))
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    published_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)
    ordering_key: Mapped[str | None] = mapped_column(String(255))
    retry_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    dead_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    parked: Mapped[bool] = mapped_column(Boolean, server_default=false())
    wake_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())


class _WrittenV5Base(DeclarativeBase):
    metadata = MetaData()


class WrittenV5(_WrittenV5Base):
    """Version 5 as first written (version 4 plus the column parked_behind and one partial index
    over the rows that have one)."""

    __tablename__ = "outbox"
    __table_args__ = (
        PrimaryKeyConstraint("id", name="pk_outbox"),
        Index(
            "ix_outbox_unpublished",
            "staged_at",
            "id",
            postgresql_where=text("published_at IS NULL"),
            sqlite_where=text("published_at IS NULL"),
        ),
        _partial(
            "ix_outbox_claimable",
            "published_at IS NULL AND dead_at IS NULL AND NOT parked",
            "staged_at",
            "id",
        ),
        _partial(
            "ix_outbox_key",
            "published_at IS NULL AND ordering_key IS NOT NULL",
            "ordering_key",
            "staged_at",
            "id",
        ),
        _partial("ix_outbox_failing", "published_at IS NULL AND attempts > 0", "staged_at", "id"),
        _partial("ix_outbox_parked_group", "parked", "staged_at"),
        _partial("ix_outbox_parked_key", "parked", "ordering_key"),
        _partial("ix_outbox_published", "published_at IS NOT NULL", "published_at"),
        _partial("ix_outbox_waking", "wake_at IS NOT NULL", "wake_at"),
        _partial("ix_outbox_parked_behind", "parked_behind IS NOT NULL", "parked_behind"),
        {"comment": "sqla-outbox schema 5"},
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid(), primary_key=True)
    job: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(255), server_default="default")
    input: Mapped[Any] = mapped_column(_JSON)
    idempotency_key: Mapped[str] = mapped_column(String(255))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    run_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    staged_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    tenant_id: Mapped[str | None] = mapped_column(String(255))
    traceparent: Mapped[str | None] = mapped_column(String(55))
    enqueued_by: Mapped[str | None] = mapped_column(String(255))
    claimed_by: Mapped[str | None] = mapped_column(String(255))
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    published_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)
    ordering_key: Mapped[str | None] = mapped_column(String(255))
    retry_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    dead_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    parked: Mapped[bool] = mapped_column(Boolean, server_default=false())
    wake_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    parked_behind: Mapped[uuid.UUID | None] = mapped_column(Uuid())


def table_of(mapped: type[DeclarativeBase]) -> Table:
    """The ``Table`` a declarative class maps."""
    table = mapped.__table__
    assert isinstance(table, Table)
    return table


MAPPED: Table = table_of(outbox.OutboxRow)


def layout(table: Table) -> dict[str, Any]:
    """Everything a table version fixes, comparable with ``==``: the name and comment; per
    column its name, Python type, SQL type on PostgreSQL and SQLite, nullability, primary-key
    membership and server default; the primary key's name; per index its name, columns,
    uniqueness and both predicates; and the DDL both dialects emit for table and indexes."""

    def server_default(column: sa.Column[Any]) -> tuple[str, ...] | None:
        default = column.server_default
        if default is None:
            return None
        arg = getattr(default, "arg", None)
        if isinstance(arg, str):
            return (arg,)
        return tuple(str(arg.compile(dialect=dialect)) for dialect in DIALECTS.values())

    def predicate(index: Index, dialect: str) -> str | None:
        where = index.dialect_options[dialect]["where"]
        return None if where is None else str(where)

    return {
        "name": table.name,
        "schema": table.schema,
        "comment": table.comment,
        "columns": [
            (
                column.name,
                type(column.type).__name__,
                *(str(column.type.compile(dialect=dialect)) for dialect in DIALECTS.values()),
                column.nullable,
                column.primary_key,
                server_default(column),
            )
            for column in table.columns
        ],
        "primary_key": (table.primary_key.name, [c.name for c in table.primary_key.columns]),
        "indexes": sorted(
            (
                str(index.name),
                tuple(c.name for c in index.columns),
                index.unique,
                predicate(index, "postgresql"),
                predicate(index, "sqlite"),
            )
            for index in table.indexes
        ),
        "ddl": {
            name: [
                str(CreateTable(table).compile(dialect=dialect)),
                *sorted(
                    str(CreateIndex(index).compile(dialect=dialect)) for index in table.indexes
                ),
            ]
            for name, dialect in DIALECTS.items()
        },
    }


# --- the frozen definitions --------------------------------------------------------------------


def test_version_1_is_the_table_as_released() -> None:
    """Version 1 built from sqla_outbox.versions is exactly the released declarative table:
    column names, order, types on both dialects, nullability, server defaults, pk_outbox,
    ix_outbox_unpublished and its predicate, the DDL, and no table comment."""
    built = versions.build_table(1, MetaData())
    assert layout(built) == layout(table_of(ReleasedV1))
    assert built.comment is None
    assert len(built.columns) == 16


def test_version_2_is_as_written() -> None:
    """Version 2 is what was written for it: version 1's columns plus ordering_key, retry_at,
    dead_at and parked, the five new partial indexes, and the comment recording the version."""
    built = versions.build_table(2, MetaData())
    assert layout(built) == layout(table_of(WrittenV2))
    assert built.comment == "sqla-outbox schema 2"


def test_version_3_is_as_written() -> None:
    """Version 3 is what was written for it: version 2's columns unchanged, plus the partial
    index ix_outbox_published over published_at where published_at IS NOT NULL, and the comment
    recording the version."""
    built = versions.build_table(3, MetaData())
    assert layout(built) == layout(table_of(WrittenV3))
    assert versions.column_names(3) == versions.column_names(2)
    assert versions.STEPS[3].index_names() == ("ix_outbox_published",)
    assert built.comment == "sqla-outbox schema 3"


def test_version_4_is_as_written() -> None:
    """Version 4 is what was written for it: version 3's columns unchanged plus the nullable
    timestamp wake_at, the partial index ix_outbox_waking over wake_at where wake_at IS NOT
    NULL, and the comment recording the version."""
    built = versions.build_table(4, MetaData())
    assert layout(built) == layout(table_of(WrittenV4))
    assert versions.column_names(4) == (*versions.column_names(3), "wake_at")
    assert versions.STEPS[4].index_names() == ("ix_outbox_waking",)
    assert built.c.wake_at.nullable
    assert isinstance(built.c.wake_at.type, UTCDateTime)
    assert built.comment == "sqla-outbox schema 4"


def test_version_5_is_the_mapped_table_and_as_written() -> None:
    """OutboxRow maps version 5 exactly (the version this release needs), and version 5 is what
    was written for it: version 4's columns unchanged plus the nullable id parked_behind, the
    partial index ix_outbox_parked_behind over it where it is not NULL, and the comment
    recording the version."""
    assert outbox.SCHEMA_VERSION == versions.SCHEMA_VERSION == 5
    built = versions.build_table(5, MetaData())
    assert layout(MAPPED) == layout(built)
    assert layout(built) == layout(table_of(WrittenV5))
    assert versions.column_names(5) == (*versions.column_names(4), "parked_behind")
    assert versions.STEPS[5].index_names() == ("ix_outbox_parked_behind",)
    assert built.c.parked_behind.nullable
    assert MAPPED.comment == "sqla-outbox schema 5"
    assert MAPPED.metadata is outbox.metadata
    assert outbox.metadata.tables[outbox.TABLE_NAME] is MAPPED


def test_only_versions_4_and_5_change_rows_before_their_removal() -> None:
    """Going down from version 4, the rows parked until they are due are unparked first (version
    3 has no wake_at, so nothing would ever wake them): the statement, pinned on both dialects,
    sets parked to false on exactly the rows with a wake_at. Version 5's is pinned in
    test_version_5_unparks_the_rows_parked_behind_a_holder_both_ways. Dropping any earlier
    step's columns or indexes is enough by itself."""
    step = versions.STEPS[4]
    assert step.before_removal is not None
    statement = step.before_removal(versions.build_table(4, MetaData()))
    assert isinstance(statement, sa.Update)
    compiled = {
        name: str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
        for name, dialect in DIALECTS.items()
    }
    assert compiled == {
        "postgresql": "UPDATE outbox SET parked=false WHERE outbox.wake_at IS NOT NULL",
        "sqlite": "UPDATE outbox SET parked=0 WHERE outbox.wake_at IS NOT NULL",
    }
    assert [v for v in versions.VERSIONS if versions.STEPS[v].before_removal] == [4, 5]


def test_version_5_unparks_the_rows_parked_behind_a_holder_both_ways() -> None:
    """Up to version 5 and down from it, the rows parked behind a holder (parked, no wake_at)
    are unparked: up, they name no holder (a claim that meets one parks it again, naming it);
    down, version 4 would keep a holder it cannot read. Rows parked until due keep their
    wake_at. No other step changes rows after it is added."""
    step = versions.STEPS[5]
    assert step.after_addition is not None
    assert step.before_removal is not None
    table = versions.build_table(5, MetaData())
    for statement in (step.after_addition(table), step.before_removal(table)):
        assert isinstance(statement, sa.Update)
        compiled = str(
            statement.compile(
                dialect=DIALECTS["postgresql"], compile_kwargs={"literal_binds": True}
            )
        )
        assert compiled == (
            "UPDATE outbox SET parked=false, parked_behind=NULL "
            "WHERE outbox.parked AND outbox.wake_at IS NULL"
        )
    assert [v for v in versions.VERSIONS if versions.STEPS[v].after_addition] == [5]


def test_each_version_is_the_one_before_plus_its_step() -> None:
    """Every later version starts with the previous version's columns, in order, adds only
    columns an existing row can take (nullable, or with a server default), and adds at least one
    column or index, so an upgrade keeps every row and SQLite (no comments) can tell the
    versions apart by their layout."""
    for version in versions.VERSIONS[1:]:
        before = versions.build_table(version - 1, MetaData())
        after = versions.build_table(version, MetaData())
        names = [column.name for column in after.columns]
        assert names[: len(before.columns)] == [column.name for column in before.columns]
        added = [after.c[name] for name in versions.STEPS[version].column_names()]
        assert [column.name for column in added] == names[len(before.columns) :]
        for column in added:
            assert column.nullable or column.server_default is not None, column.name
        assert added or versions.STEPS[version].index_names()
        assert {str(index.name) for index in before.indexes} < {
            str(index.name) for index in after.indexes
        }


def test_build_table_makes_new_objects_in_any_schema() -> None:
    """build_table gives every call its own Columns and Indexes (a Column belongs to one Table)
    and places the table in the schema asked for, leaving outbox.metadata untouched."""
    first = versions.build_table(2, MetaData())
    second = versions.build_table(2, MetaData(), schema="jobs")
    assert not set(first.columns) & set(second.columns)
    assert not set(first.indexes) & set(second.indexes)
    assert second.fullname == "jobs.outbox"
    assert list(outbox.metadata.tables) == ["outbox"]


@pytest.mark.parametrize("version", [0, 6, "2", True, None])
def test_unknown_versions_are_refused(version: Any) -> None:
    """A version that was never released is a ConfigurationError naming the argument, the value
    and the versions that exist."""
    known = r"version must be .*\(1, 2, 3, 4, 5\), got "
    with pytest.raises(outbox.ConfigurationError, match=known):
        versions.build_table(version, MetaData())


def test_reading_versions_from_comments_and_layouts() -> None:
    """version_from_comment reads only the library's own comment; version_of_layout gives the
    newest version reached step by step: a step that adds columns by its columns, one that adds
    only indexes (version 3) by its indexes, so version 4's column counts only once version 3's
    index is there too; version_added names the version of a column."""
    assert versions.version_from_comment("sqla-outbox schema 2") == 2
    assert versions.version_from_comment("sqla-outbox schema 7") == 7
    assert versions.version_from_comment("orders to publish") is None
    assert versions.version_from_comment(None) is None
    v1, v2 = versions.column_names(1), versions.column_names(2)
    assert versions.version_of_layout(v1) == 1
    assert versions.version_of_layout([*v2, "note"]) == 2
    assert versions.version_of_layout([*v2, "note"], ["ix_outbox_unpublished"]) == 2
    assert versions.version_of_layout(v2, ["ix_outbox_published"]) == 3
    assert versions.version_of_layout(v1, ["ix_outbox_published"]) == 1
    assert versions.version_of_layout([*v2, "wake_at"], ["ix_outbox_published"]) == 4
    assert versions.version_of_layout([*v2, "wake_at"], ["ix_outbox_waking"]) == 2
    assert versions.version_of_layout(v2, ["ix_outbox_published", "ix_outbox_waking"]) == 3
    assert versions.version_of_layout([*v1, "ordering_key"]) == 1
    assert versions.version_of_layout(["id", "job"]) is None
    assert versions.version_added("parked") == 2
    assert versions.version_added("job") == 1
    assert versions.version_added("wake_at") == 4
    assert versions.version_added("parked_behind") == 5
    assert versions.version_added("nope") is None


# --- the version of a database's table ---------------------------------------------------------


@pytest.fixture(params=["postgresql", "sqlite"])
def bare_url(request: pytest.FixtureRequest) -> URL:
    """An empty PostgreSQL database or SQLite file."""
    url: URL = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    return url


@pytest.fixture
def v1_engine(bare_url: URL) -> Iterator[Engine]:
    """An engine on a database whose outbox is version 1, made by the bare
    op.create_outbox_table() of a migration written before table versions existed."""
    engine = create_engine(bare_url)
    with engine.begin() as conn:
        ops: Any = Operations(MigrationContext.configure(conn))
        ops.create_outbox_table()
    yield engine
    engine.dispose()


@pytest.fixture
def v3_engine(bare_url: URL) -> Iterator[Engine]:
    """An engine on a database whose outbox is version 3, made by op.create_outbox_table(
    version=3) in a migration written for the retention release."""
    engine = create_engine(bare_url)
    with engine.begin() as conn:
        ops: Any = Operations(MigrationContext.configure(conn))
        ops.create_outbox_table(version=3)
    yield engine
    engine.dispose()


@pytest.fixture
def v2_engine(bare_url: URL) -> Iterator[Engine]:
    """An engine on a database whose outbox is version 2, made by op.create_outbox_table(
    version=2) in a migration written for the release before retention."""
    engine = create_engine(bare_url)
    with engine.begin() as conn:
        ops: Any = Operations(MigrationContext.configure(conn))
        ops.create_outbox_table(version=2)
    yield engine
    engine.dispose()


def upgrade(
    engine: Engine, from_version: int = 1, to_version: int = versions.SCHEMA_VERSION
) -> None:
    """Run op.upgrade_outbox_table(from_version, to_version) on ``engine``'s database."""
    with engine.begin() as conn:
        ops: Any = Operations(MigrationContext.configure(conn))
        ops.upgrade_outbox_table(from_version, to_version)


def test_table_version_reads_the_database(bare_url: URL) -> None:
    """table_version is None without a table, 1 for the table a bare op.create_outbox_table()
    makes, 2 after op.upgrade_outbox_table(1, 2), 3 after op.upgrade_outbox_table(2, 3) (on
    SQLite, from the index alone), 4 after op.upgrade_outbox_table(3, 4), 5 after
    op.upgrade_outbox_table(4, 5), and the current
    version for outbox.metadata.create_all()."""
    engine = create_engine(bare_url)
    try:
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) is None
        with engine.begin() as conn:
            ops: Any = Operations(MigrationContext.configure(conn))
            ops.create_outbox_table()
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 1
        upgrade(engine, 1, 2)
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 2
        upgrade(engine, 2, 3)
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 3
        upgrade(engine, 3, 4)
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 4
        upgrade(engine, 4, 5)
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == 5
        outbox.metadata.drop_all(engine)
        outbox.metadata.create_all(engine)
        with engine.connect() as conn:
            assert versions.table_version(conn, MAPPED) == CURRENT
    finally:
        engine.dispose()


def test_table_version_reads_the_comment_first_on_postgresql(pg_engine: Engine) -> None:
    """On PostgreSQL the comment decides (a newer version than this release knows is returned
    as it is); a comment that is not the library's falls back to the layout; and the
    connection's schema_translate_map is honoured."""
    with pg_engine.begin() as conn:
        conn.execute(text("COMMENT ON TABLE outbox IS 'sqla-outbox schema 7'"))
    with pg_engine.connect() as conn:
        assert versions.table_version(conn, MAPPED) == 7
    with pg_engine.begin() as conn:
        conn.execute(text("COMMENT ON TABLE outbox IS 'the outbox of the shop'"))
    with pg_engine.connect() as conn:
        assert versions.table_version(conn, MAPPED) == CURRENT
        elsewhere = conn.execution_options(schema_translate_map={None: "jobs"})
        assert versions.table_version(elsewhere, MAPPED) is None


# --- an older table is refused, naming the migration --------------------------------------------


def test_relay_check_on_a_version_1_table_names_the_upgrade(
    v1_engine: Engine, make_relay: MakeRelay
) -> None:
    """Relay.check() (and preflight.check_outbox_table under it) on a version-1 table raises
    SchemaVersionError with the sentence naming op.upgrade_outbox_table(1, 5) and the table;
    after that migration the check passes."""
    expected = PG_FIX if v1_engine.dialect.name == "postgresql" else SQLITE_FIX
    relay = make_relay(v1_engine, lambda message: None)
    with pytest.raises(outbox.SchemaVersionError) as caught:
        relay.check()
    assert str(caught.value) == expected
    assert isinstance(caught.value, outbox.OutboxError)
    with v1_engine.connect() as conn, pytest.raises(outbox.SchemaVersionError):
        check_outbox_table(conn, RELAY_PRIVILEGES, needed_by="the relay")

    upgrade(v1_engine)
    relay.check()


def test_relay_check_on_a_version_2_table_names_the_upgrade(
    v2_engine: Engine, make_relay: MakeRelay
) -> None:
    """Relay.check() on a version-2 table raises SchemaVersionError naming
    op.upgrade_outbox_table(2, 5), on PostgreSQL from the comment and on SQLite from the missing
    index of version 3 (which adds no column); after that migration the check passes."""
    expected = PG_FIX_2 if v2_engine.dialect.name == "postgresql" else SQLITE_FIX_2
    relay = make_relay(v2_engine, lambda message: None)
    with pytest.raises(outbox.SchemaVersionError) as caught:
        relay.check()
    assert str(caught.value) == expected

    upgrade(v2_engine, 2, 5)
    relay.check()


def test_relay_check_on_a_version_3_table_names_the_upgrade(
    v3_engine: Engine, make_relay: MakeRelay
) -> None:
    """Relay.check() on a version-3 table raises SchemaVersionError naming
    op.upgrade_outbox_table(3, 5): the relay's sweep parks rows in wake_at, which version 3 lacks
    (on PostgreSQL read from the comment, on SQLite from the missing column); after that
    migration the check passes."""
    expected = PG_FIX_3 if v3_engine.dialect.name == "postgresql" else SQLITE_FIX_3
    relay = make_relay(v3_engine, lambda message: None)
    with pytest.raises(outbox.SchemaVersionError) as caught:
        relay.check()
    assert str(caught.value) == expected

    upgrade(v3_engine, 3, 5)
    relay.check()


def test_relay_check_on_a_version_4_table_names_the_upgrade(
    v3_engine: Engine, make_relay: MakeRelay
) -> None:
    """Relay.check() on a version-4 table raises SchemaVersionError naming
    op.upgrade_outbox_table(4, 5): claims park rows naming the row they wait for, in
    parked_behind, which version 4 lacks; after that migration the check passes."""
    upgrade(v3_engine, 3, 4)
    expected = PG_FIX_4 if v3_engine.dialect.name == "postgresql" else SQLITE_FIX_4
    relay = make_relay(v3_engine, lambda message: None)
    with pytest.raises(outbox.SchemaVersionError) as caught:
        relay.check()
    assert str(caught.value) == expected

    upgrade(v3_engine, 4, 5)
    relay.check()


def test_enqueue_on_a_version_2_table_still_commits(v2_engine: Engine) -> None:
    """Version 3 adds only an index and versions 4 and 5 columns only relays write, none of which
    enqueue needs: on a version-2 table a staged message still commits (an application upgraded
    before its migration keeps working), and the relay's start-up check is what names the
    migration."""
    with Session(v2_engine) as session:
        outbox.enqueue(session, "send_receipt", {"order_id": 1}, ordering_key="order-1")
        session.commit()
    with v2_engine.connect() as conn:
        assert conn.execute(text("SELECT ordering_key FROM outbox")).scalar_one() == "order-1"


def test_on_a_version_3_table_enqueue_commits_and_wake_at_names_the_upgrade(
    v3_engine: Engine,
) -> None:
    """On a version-3 table a staged message still commits (enqueue never writes wake_at), while
    a statement that reaches wake_at, as a relay's sweep does, raises SchemaVersionError naming
    op.upgrade_outbox_table(3, 4) instead of the driver's "column does not exist"."""
    with Session(v3_engine) as session:
        outbox.enqueue(session, "send_receipt", {"order_id": 1})
        session.commit()
    expected = SQLITE_FIX_3  # the table as the statement names it: no catalog read
    with v3_engine.connect() as conn:
        assert conn.execute(text("SELECT job FROM outbox")).scalar_one() == "send_receipt"
        with pytest.raises(outbox.SchemaVersionError) as caught, raise_if_outdated_table(conn):
            conn.execute(sa.select(MAPPED.c.wake_at))
    assert str(caught.value) == expected


def _purge_one_old_row(engine: Engine) -> int:
    """Enqueue one message, mark it published 30 days ago, purge what is older than 7 days."""
    with Session(engine) as session:
        outbox.enqueue(session, "old", {"n": 1})
        session.commit()
    month_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)
    with engine.begin() as conn:
        conn.execute(sa.update(MAPPED).values(published_at=month_ago))
    return outbox.purge(engine, older_than=dt.timedelta(days=7))


def test_purge_runs_on_a_version_3_table(v3_engine: Engine) -> None:
    """purge() reads only ix_outbox_published (version 3) and published rows: a version-3
    table is purged as the current one is, though relays need version 5."""
    assert _purge_one_old_row(v3_engine) == 1


def test_purge_refuses_a_version_2_table(v2_engine: Engine) -> None:
    """On a version-2 table (no ix_outbox_published) purge() names the upgrade."""
    with pytest.raises(outbox.SchemaVersionError, match=r"upgrade_outbox_table\(2, 5\)"):
        _purge_one_old_row(v2_engine)


def test_enqueue_on_a_version_1_table_names_the_upgrade(v1_engine: Engine) -> None:
    """enqueue + commit on a version-1 table raises SchemaVersionError naming
    op.upgrade_outbox_table(1, 5) (not the driver's "column does not exist"), and writes
    nothing; after the migration the same enqueue commits."""
    expected = PG_FIX if v1_engine.dialect.name == "postgresql" else SQLITE_FIX
    expected = expected.replace("'public.outbox'", "'outbox'")  # no catalog read at commit
    with Session(v1_engine) as session:
        outbox.enqueue(session, "send_receipt", {"order_id": 1})
        with pytest.raises(outbox.SchemaVersionError) as caught:
            session.commit()
    assert str(caught.value) == expected
    assert isinstance(caught.value.__cause__, DBAPIError)
    # A write that fails at the connection's COMMIT currently leaves that pooled connection in
    # its failed transaction (staging's concern, not the version check's): start afresh.
    v1_engine.dispose()
    with v1_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 0

    upgrade(v1_engine)
    with Session(v1_engine) as session:
        outbox.enqueue(session, "send_receipt", {"order_id": 1}, ordering_key="order-1")
        session.commit()
    with v1_engine.connect() as conn:
        assert conn.execute(text("SELECT ordering_key FROM outbox")).scalar_one() == "order-1"


def test_only_columns_of_later_versions_mean_an_old_table(v1_engine: Engine) -> None:
    """missing_column reads the column out of the driver's error; raise_if_outdated_table (and
    raise_if_missing_table) turn only a column a later version added into SchemaVersionError,
    and let any other error through unchanged."""
    table = versions.build_table(2, MetaData())
    with v1_engine.connect() as conn:
        fix = rf"upgrade_outbox_table\(1, {CURRENT}\)"
        with pytest.raises(outbox.SchemaVersionError, match=fix), raise_if_outdated_table(conn):
            conn.execute(sa.select(table.c.parked))
        conn.rollback()
        with pytest.raises(outbox.SchemaVersionError), raise_if_missing_table(conn):
            conn.execute(sa.update(table).values(retry_at=None))
        conn.rollback()
        with pytest.raises(DBAPIError) as caught, raise_if_outdated_table(conn):
            conn.execute(text("SELECT nope FROM outbox"))
        assert missing_column(caught.value) == "nope"
        conn.rollback()
        with pytest.raises(DBAPIError) as caught, raise_if_outdated_table(conn):
            conn.execute(text("SELECT FROM_nowhere("))
        assert missing_column(caught.value) is None


def test_missing_table_names_the_versioned_create(bare_url: URL, make_relay: MakeRelay) -> None:
    """Without the table, the start-up check names op.create_outbox_table(version=5), the
    current version: a bare call would create version 1, which this release refuses."""
    engine = create_engine(bare_url)
    fix = rf"create_outbox_table\(version={CURRENT}\)"
    try:
        with pytest.raises(outbox.MissingTableError, match=fix):
            make_relay(engine, lambda message: None).check()
    finally:
        engine.dispose()
