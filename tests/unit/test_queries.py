"""The relay's SQL, compiled without a database: the few facts the guarantees rest on that a
SQL diff could hide. The whole text of every statement is pinned by the golden files
(``tests/unit/test_golden_sql.py``); behaviour is pinned against real databases
(``tests/stores``)."""

from __future__ import annotations

import re

import pytest
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect

from sqla_outbox import queries
from sqla_outbox.message import OutboxMessage
from sqla_outbox.queries.terms import outbox_table
from sqla_outbox.stores import psycopg_sql

DIALECTS: dict[str, Dialect] = {
    "postgresql": PGDialect_psycopg(),  # type: ignore[no-untyped-call]
    "sqlite": SQLiteDialect_pysqlite(),
}


def compiled(stmt: object, dialect: str) -> str:
    """``stmt`` compiled for ``dialect``, its whitespace collapsed to single spaces."""
    return " ".join(str(stmt.compile(dialect=DIALECTS[dialect])).split())  # type: ignore[attr-defined]


def test_message_fields_match_the_message_tuple() -> None:
    """A claimed row maps positionally onto OutboxMessage, then its failed attempts so far."""
    assert OutboxMessage._fields == queries.MESSAGE_FIELDS
    assert (*queries.MESSAGE_FIELDS, "attempts") == queries.CLAIM_FIELDS


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
@pytest.mark.parametrize("order", ["key", "strict"])
def test_the_window_reads_the_claimable_partial_index_in_claim_order(
    dialect: str, order: str
) -> None:
    """Every term of ix_outbox_claimable's predicate appears verbatim in the window's WHERE (a
    planner needs that to use a partial index; SQLite's matches terms as written), the rows come
    in claim order, limited by the window written into the SQL, and on PostgreSQL locked
    ``FOR UPDATE SKIP LOCKED``."""
    [index] = [i for i in outbox_table.indexes if i.name == "ix_outbox_claimable"]
    predicate = str(index.dialect_options[dialect]["where"])
    sql = compiled(queries.window_stmt(dialect, order), dialect)
    where = sql[sql.rindex("FROM outbox WHERE") :]
    for term in predicate.split(" AND "):
        assert re.sub(r"\b(published_at|dead_at|parked)\b", r"outbox.\1", term) in where, term
    assert "ORDER BY outbox.staged_at, outbox.id LIMIT __[POSTCOMPILE_window]" in where
    assert where.endswith("FOR UPDATE SKIP LOCKED") == (dialect == "postgresql")


def test_claim_limits_are_written_into_the_sql_and_only_ints() -> None:
    """The window and the limit are SQL text (a generic plan can know them), and only ints."""
    window = psycopg_sql.precompile(queries.window_stmt("postgresql"), DIALECTS["postgresql"])
    assert window.inline == ("window",)
    assert "LIMIT 400" in window.text({"window": 400})
    with pytest.raises(TypeError, match="must be an int"):
        window.text({"window": "400; DROP TABLE outbox"})
    fast = psycopg_sql.precompile(queries.fast_claim_stmt(), DIALECTS["postgresql"])
    assert fast.inline == ("limit",)


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_every_update_after_the_claim_is_fenced(dialect: str) -> None:
    """Mark, release, charge and renew touch only rows still carrying this claim's token and
    unpublished, so a relay that stalled past its lease changes nothing another relay holds."""
    param = "%(token)s::VARCHAR" if dialect == "postgresql" else "?"
    fence = f"outbox.claimed_by = {param} AND outbox.published_at IS NULL"
    for statement in (
        queries.mark_published_stmt(dialect),
        queries.release_stmt(dialect),
        queries.fail_stmt(dialect),
        queries.renew_stmt(dialect),
    ):
        assert fence in compiled(statement, dialect)
    assert "outbox.claimed_by IS NOT DISTINCT FROM target.fence" in compiled(
        queries.settle_stmt(), "postgresql"
    )


def test_statements_on_sqlite_use_the_relays_clock() -> None:
    """SQLite has no server clock: its statements compare against bound instants, never a
    function of the database (see sqla_outbox.clock)."""
    for statement in (
        queries.window_stmt("sqlite"),
        queries.holders_stmt("sqlite"),
        queries.stamp_stmt("sqlite"),
        queries.fail_stmt("sqlite"),
        queries.idle_stmt("sqlite"),
    ):
        sql = compiled(statement, "sqlite")
        assert "now()" not in sql.lower() and "CURRENT_TIMESTAMP" not in sql


def test_numbered_sql_numbers_each_parameter_once() -> None:
    """psycopg's own conversion, done once: a name used twice keeps its number, ``%%`` is a
    ``%`` again, and ``%(name)b`` (binary) becomes a plain number too."""
    numbered = psycopg_sql._numbered("a %% b %(x)s %(y)b %(x)s")
    assert numbered == ("a % b $1 $2 $1", ("x", "y"), frozenset({"y"}))


@pytest.mark.parametrize(
    ("statement", "params"),
    [
        (
            queries.fast_claim_stmt(mark=True),
            {"limit": 100, "lease": None, "token": "t", "done": "p", "previous_ids": []},
        ),
        (
            queries.settle_stmt(),
            {
                "token": "t",
                "ids": [],
                "handed_ids": [],
                "errors": [],
                "delays": [],
                "deads": [],
                "parks": [],
                "behinds": [],
            },
        ),
    ],
    ids=["claim-carrying-a-mark", "settle"],
)
def test_numbered_statements_send_every_parameter_in_order(
    statement: object, params: dict[str, object]
) -> None:
    """A statement as the relay sends it numbered: no named placeholder is left, each number
    has its value in :meth:`values`, the UUID arrays travel binary and the statement's own
    constants are filled in."""
    precompiled = psycopg_sql.precompile(statement, DIALECTS["postgresql"])  # type: ignore[arg-type]
    sql = precompiled.text(params, numbered=True)
    assert "%(" not in sql
    numbers = {int(n) for n in re.findall(r"\$(\d+)", sql)}
    values = precompiled.values(params)
    assert numbers == set(range(1, len(values) + 1))
    for name, value in zip(precompiled.names, values, strict=True):
        assert isinstance(value, psycopg_sql._BinaryArray) == (name in precompiled.binary)
        assert value == params.get(name, precompiled.constants.get(name))
