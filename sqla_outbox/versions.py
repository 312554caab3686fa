"""Released versions of the outbox table: each frozen forever, each later one a step from the last.

A migration written against table version N must create version N whenever it runs, today or
after any future upgrade of sqla-outbox, or replaying an application's migration history would
build a table its later migrations do not expect. So a released version is never edited: a change
to the table ships as a new version, defined here as one :class:`Step` (the columns and indexes it
adds, the table comment it sets), together with the Alembic operation that moves an existing table
between versions without losing a row (``op.upgrade_outbox_table``, :mod:`alembic_ext.ops`).

Everything else is derived from the steps, so no column is written twice:

* :func:`build_table` builds version N (the steps ``1..N``) on a ``MetaData``;
  :class:`~sqla_outbox.model.OutboxRow` maps ``build_table(SCHEMA_VERSION, metadata)``, and the
  Alembic operations build the version they were asked for.
* ``op.upgrade_outbox_table(N, N + 1)`` adds step N + 1's columns (each nullable or with a server
  default, so existing rows take a value), creates its indexes and sets its comment; the reverse
  drops that step's indexes, then its columns, and restores version N's comment.
* :func:`table_version` tells which version a database's table is.

The versions:

1. The table as first released: sixteen columns, primary key ``pk_outbox``, the partial index
   ``ix_outbox_unpublished``. No table comment (it was released without one).
2. Ordering keys, per-row retries and dead letters: ``ordering_key``, ``retry_at``, ``dead_at``,
   ``parked`` and five partial indexes for the claim. Table comment ``sqla-outbox schema 2``.
3. Retention: the partial index ``ix_outbox_published`` over the published rows by
   ``published_at``, so :func:`sqla_outbox.purge` finds the oldest published rows without
   reading the table. No new column. Table comment ``sqla-outbox schema 3``.
4. Rows parked until they come due: ``wake_at`` and the partial index ``ix_outbox_waking`` over
   the rows that have one (:mod:`sqla_outbox.waiting`). Table comment ``sqla-outbox schema 4``.
   Down to version 3, the rows parked that way are unparked first (:attr:`Step.before_removal`):
   version 3 has nothing that would wake them.
5. Parked rows name the row they wait for: ``parked_behind`` and the partial index
   ``ix_outbox_parked_behind`` over the rows that have one, so publishing, retrying or discarding
   a stuck row frees exactly the rows parked behind it (:mod:`sqla_outbox.plan`). Table comment
   ``sqla-outbox schema 5``. Up from version 4, the rows parked behind a holder are unparked
   (:attr:`Step.after_addition`): they name none, and the next claim that meets one parks it
   again, naming its holder. Down to version 4, likewise (:attr:`Step.before_removal`).

On PostgreSQL every version also has fillfactor 50 and the notification trigger of
:mod:`sqla_outbox.ddl`; those statements (and the ``.sql`` files they load) are frozen as well.

MySQL and MariaDB (10.6+ / 8.0+) get the same versions, columns and meaning, written in their
types (:mod:`sqla_outbox.coltypes`: ``BINARY(16)`` ids, ``DATETIME(6)`` timestamps, ``JSON``),
in an InnoDB table of ``utf8mb4`` text (four-byte characters included) with the binary collation
``utf8mb4_bin``, so text compares exactly, as on PostgreSQL (``'Order-1'`` and ``'order-1'`` are
two ordering keys). No trigger: relays there poll. They have no partial indexes, so each index
is built there as the composite index its :attr:`IndexSpec.mysql_columns` names (see
:class:`IndexSpec`). That MySQL form of versions 1 to 3 was added after their release, with the
MySQL support; it is frozen from then on like the rest.

The version is recorded in the table's comment from version 2 on. SQLite keeps no comments, and a
version-1 table has none, so :func:`table_version` falls back to the layout
(:func:`version_of_layout`): a step that adds columns is recognised by its columns, one that adds
only indexes (version 3) by its indexes. The trap: a step must add at least one column or one
index, or it could not be told apart on SQLite.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    false,
    null,
    text,
)
from sqlalchemy.engine import Inspector
from sqlalchemy.schema import Constraint
from sqlalchemy.sql import Executable

from sqla_outbox.coltypes import ID_TYPE, JSON_TYPE, MYSQL_DIALECTS, UTCDateTime
from sqla_outbox.errors import ConfigurationError

__all__ = [
    "SCHEMA_VERSION",
    "STEPS",
    "TABLE_NAME",
    "VERSIONS",
    "IndexSpec",
    "Step",
    "build_table",
    "check_version",
    "column_names",
    "inspected_version",
    "mysql_index_columns",
    "table_comment",
    "table_version",
    "version_added",
    "version_from_comment",
    "version_of_layout",
]

#: The outbox table's name, the same in every version.
TABLE_NAME = "outbox"

SCHEMA_VERSION = 5
"""The table version this release of sqla-outbox reads and writes."""

_COMMENT = "sqla-outbox schema {version}"
_COMMENT_RE = re.compile(r"sqla-outbox schema (\d+)")


@dataclass(frozen=True)
class IndexSpec:
    """A partial index: its name, its columns in order, and its ``WHERE`` predicate; and the
    columns of the index that stands for it on MySQL and MariaDB.

    Those have no partial indexes, and an index on ``columns`` alone would hold every row ever
    published: the claim, walking ``(staged_at, id)`` from the oldest, would step over the whole
    published history before it reached the first unpublished row. So ``mysql_columns`` are the
    columns the predicate tests, in the order it names them, then ``columns``: the rows the
    partial index holds are then one contiguous range of the MySQL index (``published_at IS
    NULL`` first, as InnoDB sorts NULL first), in the partial index's own order, and a query
    that states the predicate as equalities (``published_at IS NULL``, ``parked = false``)
    reads just that range, in claim order. A range test (``attempts > 0``) comes last of the
    predicate's columns, so its rows are still one range (ordered by it, not by ``columns``;
    they are the few failed rows). The rule is pinned by a test for every index.
    """

    name: str
    columns: tuple[str, ...]
    where: str
    mysql_columns: tuple[str, ...]

    def to_index(self) -> Index:
        """A new, unattached ``Index``; it binds to the table it is passed to."""
        predicate = text(self.where)
        return Index(self.name, *self.columns, postgresql_where=predicate, sqlite_where=predicate)


@dataclass(frozen=True)
class Step:
    """What table version ``version`` adds to the version before it (version 1: to nothing).

    ``columns`` and ``constraints`` are factories because a ``Column`` belongs to exactly one
    ``Table``: every table built gets new ones. ``comment`` is the table comment of this version.
    ``before_removal``, given this version's table, is the statement that makes its rows mean
    the same to the version before it, run before the step's columns are dropped (``None``:
    dropping them is enough). ``after_addition`` is its counterpart going up: run once the
    step's columns and indexes exist, so the rows kept mean the same to this version.
    """

    version: int
    columns: Callable[[], list[Column[Any]]]
    indexes: tuple[IndexSpec, ...]
    comment: str | None
    constraints: Callable[[], list[Constraint]] = list
    before_removal: Callable[[Table], Executable] | None = None
    after_addition: Callable[[Table], Executable] | None = None

    def column_names(self) -> tuple[str, ...]:
        """The names of the columns this step adds, in table order."""
        return tuple(column.name for column in self.columns())

    def index_names(self) -> tuple[str, ...]:
        """The names of the indexes this step adds."""
        return tuple(index.name for index in self.indexes)


# --- version 1: the table as first released (frozen) ------------------------------------------


def _columns_1() -> list[Column[Any]]:
    return [
        Column("id", ID_TYPE, primary_key=True),
        Column("job", String(255), nullable=False),
        Column("queue", String(255), nullable=False, server_default="default"),
        Column("input", JSON_TYPE, nullable=False),
        Column("idempotency_key", String(255), nullable=False),
        Column("max_attempts", Integer, nullable=False, server_default=text("3")),
        Column("run_at", UTCDateTime(), nullable=False),
        Column("staged_at", UTCDateTime(), nullable=False),
        Column("tenant_id", String(255), nullable=True),
        Column("traceparent", String(55), nullable=True),
        Column("enqueued_by", String(255), nullable=True),
        Column("claimed_by", String(255), nullable=True),
        Column("claimed_at", UTCDateTime(), nullable=True),
        Column("published_at", UTCDateTime(), nullable=True),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("last_error", Text, nullable=True),
    ]


def _constraints_1() -> list[Constraint]:
    return [PrimaryKeyConstraint("id", name="pk_outbox")]


# --- version 2: ordering keys, per-row retries, dead letters (frozen) --------------------------


def _columns_2() -> list[Column[Any]]:
    # Added to tables that already hold rows: each is nullable or has a server default.
    return [
        Column("ordering_key", String(255), nullable=True),
        Column("retry_at", UTCDateTime(), nullable=True),
        Column("dead_at", UTCDateTime(), nullable=True),
        Column("parked", Boolean, nullable=False, server_default=false()),
    ]


# --- version 3: an index for retention (frozen) ---------------------------------------------------


def _columns_3() -> list[Column[Any]]:
    return []  # an index only


# --- version 4: rows parked until they come due (frozen) -----------------------------------------


def _columns_4() -> list[Column[Any]]:
    return [Column("wake_at", UTCDateTime(), nullable=True)]


def _unpark_waking(table: Table) -> Executable:
    # Version 3 has no wake_at: a row parked until it comes due would stay parked until some
    # relay's sweep found nothing stuck before it. Claimable again at once instead.
    # false() rather than False: an offline migration renders it as SQL, not as a placeholder.
    return sa.update(table).where(table.c.wake_at.is_not(None)).values(parked=false())


# --- version 5: parked rows name what they wait for (frozen) ------------------------------------


def _columns_5() -> list[Column[Any]]:
    return [Column("parked_behind", ID_TYPE, nullable=True)]


def _unpark_held(table: Table) -> Executable:
    # Rows parked behind a holder by a release that did not record it (version 4), or that would
    # keep a holder version 4 cannot read: claimable again, and the next claim that meets one
    # parks it again if it still waits (rows parked until due keep their wake_at).
    return (
        sa.update(table)
        .where(table.c.parked, table.c.wake_at.is_(None))
        .values(parked=false(), **({"parked_behind": null()} if "parked_behind" in table.c else {}))
    )


STEPS: Mapping[int, Step] = {
    1: Step(
        version=1,
        columns=_columns_1,
        constraints=_constraints_1,
        indexes=(
            IndexSpec(
                "ix_outbox_unpublished",
                ("staged_at", "id"),
                "published_at IS NULL",
                mysql_columns=("published_at", "staged_at", "id"),
            ),
        ),
        comment=None,
    ),
    2: Step(
        version=2,
        columns=_columns_2,
        indexes=(
            IndexSpec(
                "ix_outbox_claimable",
                ("staged_at", "id"),
                "published_at IS NULL AND dead_at IS NULL AND NOT parked",
                mysql_columns=("published_at", "dead_at", "parked", "staged_at", "id"),
            ),
            IndexSpec(
                "ix_outbox_key",
                ("ordering_key", "staged_at", "id"),
                "published_at IS NULL AND ordering_key IS NOT NULL",
                mysql_columns=("published_at", "ordering_key", "staged_at", "id"),
            ),
            IndexSpec(
                "ix_outbox_failing",
                ("staged_at", "id"),
                "published_at IS NULL AND attempts > 0",
                mysql_columns=("published_at", "attempts", "staged_at", "id"),
            ),
            IndexSpec(
                "ix_outbox_parked_group",
                ("staged_at",),
                "parked",
                mysql_columns=("parked", "staged_at"),
            ),
            IndexSpec(
                "ix_outbox_parked_key",
                ("ordering_key",),
                "parked",
                mysql_columns=("parked", "ordering_key"),
            ),
        ),
        comment=_COMMENT.format(version=2),
    ),
    3: Step(
        version=3,
        columns=_columns_3,
        indexes=(
            # Purge's batches: the oldest published rows first, found without reading the
            # unpublished ones or the table (sqla_outbox.retention).
            # On MySQL the plain index: its NULLs (the unpublished rows) sort first, and purge's
            # range (published_at < cutoff) never reaches them.
            IndexSpec(
                "ix_outbox_published",
                ("published_at",),
                "published_at IS NOT NULL",
                mysql_columns=("published_at",),
            ),
        ),
        comment=_COMMENT.format(version=3),
    ),
    4: Step(
        version=4,
        columns=_columns_4,
        indexes=(
            # The rows parked until they come due, by when: what a sweep wakes, read without
            # reading the rest. On MySQL the plain index: its NULLs (every other row) sort
            # first, and the sweep's range (wake_at <= ...) never reaches them.
            IndexSpec(
                "ix_outbox_waking",
                ("wake_at",),
                "wake_at IS NOT NULL",
                mysql_columns=("wake_at",),
            ),
        ),
        comment=_COMMENT.format(version=4),
        before_removal=_unpark_waking,
    ),
    5: Step(
        version=5,
        columns=_columns_5,
        indexes=(
            # The rows parked behind each stuck row: what its mark, retry or discard unparks,
            # found without reading the other parked rows. On MySQL the plain index: its NULLs
            # (every row not parked behind another) sort first, and an equality never meets them.
            IndexSpec(
                "ix_outbox_parked_behind",
                ("parked_behind",),
                "parked_behind IS NOT NULL",
                mysql_columns=("parked_behind",),
            ),
        ),
        comment=_COMMENT.format(version=5),
        before_removal=_unpark_held,
        after_addition=_unpark_held,
    ),
}
"""Every released version's step, by version. Append new versions; never edit one."""

VERSIONS: tuple[int, ...] = tuple(sorted(STEPS))
"""Every released table version, oldest first."""


# --- derived ------------------------------------------------------------------------------------


def check_version(version: object, *, argument: str = "version") -> int:
    """``version`` if it is a released table version, else :class:`ConfigurationError`."""
    if isinstance(version, bool) or not isinstance(version, int) or version not in STEPS:
        known = ", ".join(str(known) for known in VERSIONS)
        raise ConfigurationError(
            f"{argument} must be an outbox table version ({known}), got {version!r}. "
            f"Pass e.g. {argument}={SCHEMA_VERSION}, the version this sqla-outbox needs."
        )
    return version


# The table options on MySQL and MariaDB (see the module docs). SQLAlchemy reads ``mysql_``
# options for a ``mysql://`` URL and ``mariadb_`` ones for a ``mariadb://`` URL.
_MYSQL_OPTIONS = {"engine": "InnoDB", "charset": "utf8mb4", "collate": "utf8mb4_bin"}
_TABLE_OPTIONS: dict[str, Any] = {
    f"{dialect}_{option}": value
    for dialect in MYSQL_DIALECTS
    for option, value in _MYSQL_OPTIONS.items()
}


def build_table(version: int, metadata: MetaData, *, schema: str | None = None) -> Table:
    """A new ``Table`` of table version ``version`` on ``metadata``, in ``schema``.

    ``schema=None`` leaves the table in the connection's default schema.
    """
    steps = [STEPS[v] for v in VERSIONS if v <= check_version(version)]
    return Table(
        TABLE_NAME,
        metadata,
        *(column for step in steps for column in step.columns()),
        *(constraint for step in steps for constraint in step.constraints()),
        *(spec.to_index() for step in steps for spec in step.indexes),
        schema=schema,
        comment=table_comment(version),
        **_TABLE_OPTIONS,
    )


_SPECS: Mapping[str, IndexSpec] = {
    spec.name: spec for step in STEPS.values() for spec in step.indexes
}


def mysql_index_columns(index: Index) -> tuple[str, ...] | None:
    """The columns of ``index`` on MySQL and MariaDB if it is one of the outbox's indexes (its
    table is named ``outbox``, its name and columns are a released index's), else ``None``.

    :mod:`sqla_outbox.ddl` builds the outbox's indexes from these there; the Alembic comparator
    takes them for what such an index has in the database.
    """
    spec = _SPECS.get(str(index.name))
    table = index.table
    if spec is None or table is None or table.name != TABLE_NAME:
        return None
    if tuple(column.name for column in index.columns) != spec.columns:
        return None
    return spec.mysql_columns


def table_comment(version: int) -> str | None:
    """The table comment of ``version``: ``"sqla-outbox schema N"``, or ``None`` for version 1."""
    return STEPS[check_version(version)].comment


def column_names(version: int) -> tuple[str, ...]:
    """Every column of ``version``, in table order."""
    return tuple(
        name for v in VERSIONS if v <= check_version(version) for name in STEPS[v].column_names()
    )


def version_added(column: str) -> int | None:
    """The version that added the column named ``column`` (``None``: no version has it)."""
    for version in VERSIONS:
        if column in STEPS[version].column_names():
            return version
    return None


def version_from_comment(comment: str | None) -> int | None:
    """The version a table comment records, or ``None`` if it records none (or an unknown one)."""
    match = _COMMENT_RE.fullmatch(comment or "")
    return int(match.group(1)) if match else None


def version_of_layout(columns: Iterable[str], indexes: Iterable[str] = ()) -> int | None:
    """The latest version a table with these column and index names has reached; ``None`` if not
    even version 1's columns are there.

    Each step is checked in turn: one that adds columns is reached when all its columns are in
    ``columns`` (its indexes are not required, as before version 3); one that adds only indexes
    when all its indexes are in ``indexes``.
    """
    present_columns, present_indexes = set(columns), set(indexes)
    found = None
    for version in VERSIONS:
        step = STEPS[version]
        added = step.column_names()
        if added and not set(added) <= present_columns:
            break
        if not added and not set(step.index_names()) <= present_indexes:
            break
        found = version
    return found


def inspected_version(inspector: Inspector, name: str, schema: str | None) -> int | None:
    """The version of table ``name`` in ``schema`` as ``inspector`` sees it (``None``: no such
    table, or not an outbox): the comment's version where the dialect keeps comments, else the
    layout's (see the module docs)."""
    if not inspector.has_table(name, schema=schema):
        return None
    if inspector.dialect.supports_comments:
        recorded = version_from_comment(inspector.get_table_comment(name, schema=schema)["text"])
        if recorded is not None:
            return recorded
    return version_of_layout(
        (column["name"] for column in inspector.get_columns(name, schema)),
        (str(index["name"]) for index in inspector.get_indexes(name, schema)),
    )


def table_version(connection: Connection, table: Table) -> int | None:
    """The version of ``table`` (e.g. ``OutboxRow.__table__``) in ``connection``'s database, or
    ``None`` if it is missing or not an outbox.

    The table's schema honours the connection's ``schema_translate_map``. Reads the table comment
    on PostgreSQL and falls back to the layout (see the module docs). A comment naming a version
    newer than this release knows is returned as it is.
    """
    translate = connection.get_execution_options().get("schema_translate_map") or {}
    schema = translate.get(table.schema, table.schema)
    return inspected_version(sa.inspect(connection), table.name, schema)
