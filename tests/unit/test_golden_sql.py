"""Golden files of the SQL every statement compiles to, per dialect and variant.

``tests/golden/<dialect>/<statement>.sql`` holds what each statement the library runs compiles
to, laid out by sqlparse so a reviewer reads it; this test fails when the compiled SQL changes
without its file. A change to a statement therefore shows as a SQL diff in review. To accept
one, rewrite the files and read the diff::

    SQLA_OUTBOX_WRITE_GOLDEN=1 .venv/bin/pytest tests/unit/test_golden_sql.py
    git diff tests/golden

The catalog below lists every statement each store runs, on the dialects it runs on. Files in
``tests/golden`` that no catalog entry writes fail the test too, so none goes stale.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlparse
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import Dialect

from sqla_outbox import queries

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
WRITE = os.environ.get("SQLA_OUTBOX_WRITE_GOLDEN") == "1"

DIALECTS: dict[str, Dialect] = {
    "postgresql": PGDialect_psycopg(),  # type: ignore[no-untyped-call]
    "sqlite": sqlite.dialect(),  # type: ignore[no-untyped-call]
    "mysql": MySQLDialect_pymysql(),
}
"""The drivers the stores run on: psycopg 3 on PostgreSQL (its SQL as psycopg is sent it),
pysqlite, and PyMySQL (MySQL and MariaDB compile the same)."""
assert postgresql and mysql  # the dialect packages above, imported for their drivers


def _everywhere(name: str, build: Callable[[str], Any]) -> Iterator[tuple[str, str, Any]]:
    for dialect in DIALECTS:
        yield dialect, name, build(dialect)


def catalog() -> Iterator[tuple[str, str, Any]]:
    """``(dialect, file name, statement)`` for every statement a store or an operator runs."""
    for order in queries.ORDERS:
        yield from _everywhere(f"window-{order}", lambda d, o=order: queries.window_stmt(d, o))
        for mark in (False, True):
            name = f"fast_claim-{order}" + ("-mark" if mark else "")
            yield "postgresql", name, queries.fast_claim_stmt(order, mark=mark)
    yield from _everywhere("holders", queries.holders_stmt)
    yield from _everywhere("stamp", queries.stamp_stmt)
    yield from _everywhere("park_rows", queries.park_rows_stmt)
    yield from _everywhere("mark", queries.mark_published_stmt)
    yield from _everywhere("release", queries.release_stmt)
    yield from _everywhere("fail", queries.fail_stmt)
    yield from _everywhere("renew", queries.renew_stmt)
    yield from _everywhere("unpark_behind", queries.unpark_behind_stmt)
    for dialect in ("postgresql", "sqlite"):
        yield dialect, "unpark_behind-dead", queries.unpark_behind_stmt(dialect, dead=True)
        yield dialect, "sweep_parked", queries.sweep_parked_stmt(dialect)
    yield "mysql", "links", queries.links_stmt("mysql")
    yield "mysql", "free_parked", queries.free_parked_stmt("mysql")
    yield "mysql", "unpark_rows", queries.unpark_rows_stmt("mysql")
    yield "mysql", "waiting_head", queries.waiting_head_stmt("mysql")
    yield from _everywhere(
        "parked_window_end",
        lambda _d: queries.window_end_stmt(queries.parked_window().subquery("parked_row")),
    )
    yield from _everywhere("park_waiting", queries.park_waiting_stmt)
    yield from _everywhere("wake", queries.wake_stmt)
    yield from _everywhere("idle", queries.idle_stmt)
    yield "postgresql", "settle", queries.settle_stmt()
    yield "postgresql", "sweep", queries.sweep_stmt()
    yield "postgresql", "unclaim", queries.unclaim_stmt()
    yield "postgresql", "analyze", queries.analyze_stmt()
    yield "postgresql", "notify", queries.notify_stmt()
    yield from _everywhere("stage", lambda _d: queries.stage_stmt())
    yield from _everywhere("pending", lambda _d: queries.pending_stmt())
    yield from _everywhere("status", queries.status_stmt)
    yield from _everywhere("claims", lambda _d: queries.claims_stmt())
    yield from _everywhere("holding", lambda _d: queries.holding_stmt())
    yield from _everywhere("backlog", queries.backlog_stmt)
    yield from _everywhere("purge", queries.purge_stmt)
    for ids in (False, True):
        suffix = "-ids" if ids else "-all"
        yield from _everywhere(
            f"dead_letters{suffix}", lambda d, i=ids: queries.dead_letters_stmt(d, ids=i)
        )
        yield from _everywhere(
            f"retry_dead{suffix}", lambda d, i=ids: queries.retry_dead_stmt(d, ids=i)
        )
        yield from _everywhere(
            f"delete_dead{suffix}", lambda d, i=ids: queries.delete_dead_stmt(d, ids=i)
        )
        yield (
            "mysql",
            f"dead_letters-lock{suffix}",
            queries.dead_letters_stmt("mysql", ids=ids, lock=True),
        )


def render(statement: Any, dialect: str) -> str:
    """``statement`` compiled for ``dialect`` and laid out for reading."""
    sql = str(statement.compile(dialect=DIALECTS[dialect]))
    text = sqlparse.format(sql, reindent=True, keyword_case="upper", indent_width=2)
    return "\n".join(line.rstrip() for line in text.splitlines()).strip() + "\n"


ENTRIES = sorted((dialect, name) for dialect, name, _ in catalog())


@pytest.mark.parametrize(("dialect", "name"), ENTRIES)
def test_compiled_sql_matches_its_golden_file(dialect: str, name: str) -> None:
    """The statement compiles to exactly the SQL in its golden file."""
    [statement] = [s for d, n, s in catalog() if (d, n) == (dialect, name)]
    path = GOLDEN / dialect / f"{name}.sql"
    sql = render(statement, dialect)
    if WRITE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(sql)
    assert path.exists(), f"no golden file {path}: run with SQLA_OUTBOX_WRITE_GOLDEN=1"
    assert sql == path.read_text(), (
        f"{dialect} {name} compiles to other SQL than {path.relative_to(GOLDEN.parent)}; "
        "if the change is meant, run with SQLA_OUTBOX_WRITE_GOLDEN=1 and review the diff"
    )


def test_every_golden_file_has_its_statement() -> None:
    """No golden file outlives its statement."""
    files = sorted((path.parent.name, path.stem) for path in GOLDEN.glob("*/*.sql"))
    if WRITE:
        for dialect, name in set(files) - set(ENTRIES):
            (GOLDEN / dialect / f"{name}.sql").unlink()
        return
    assert files == ENTRIES
