"""The relay's SQL, compiled without a database: the properties that must never regress.

Each test pins a property the relay's guarantees rest on (locking, claim order, the fence, the
ordering guard, the partial index), not the statement's whole text: aliases and the shape of
the plan may change, these may not.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Index
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect

from sqla_outbox import driver_sql, queries
from sqla_outbox.message import OutboxMessage

# The drivers the relay runs on (psycopg 3 on PostgreSQL), so the text is what they are sent.
DIALECTS: dict[str, Dialect] = {
    "postgresql": PGDialect_psycopg(),  # type: ignore[no-untyped-call]
    "sqlite": SQLiteDialect_pysqlite(),
}

# Bound parameters as each dialect spells them: PostgreSQL names them (psycopg adds a cast to
# some); SQLite writes every one as `?`.
PG_PARAM = r"%\(\w+\)s(?:::\w+(?:\[\])?)?"


def compiled(stmt: object, dialect: str) -> str:
    """``stmt`` compiled for ``dialect``, its whitespace collapsed to single spaces."""
    return " ".join(str(stmt.compile(dialect=DIALECTS[dialect])).split())  # type: ignore[attr-defined]


def cte(sql: str, name: str) -> str:
    """The body of the CTE ``name`` in ``sql``: from ``name AS (`` to its closing parenthesis."""
    match = re.search(rf"\b{name}(?:\([^)]*\))? AS \(", sql)
    assert match is not None, f"no CTE {name!r} in {sql}"
    depth, start = 1, match.end()
    for index in range(start, len(sql)):
        depth += {"(": 1, ")": -1}.get(sql[index], 0)
        if depth == 0:
            return sql[start:index]
    raise AssertionError(f"CTE {name!r} is not closed")


def claimable_index() -> Index:
    [index] = [i for i in queries.outbox_table.indexes if i.name == "ix_outbox_claimable"]
    return index


# --- the claim ---------------------------------------------------------------------------------


def test_postgresql_claim_locks_parks_and_stamps_in_one_statement() -> None:
    """The claim is one statement: candidates locked FOR UPDATE SKIP LOCKED in claim order and
    limited by the window; the parking and the stamping UPDATEs are CTEs of it; its result is
    a row of counts joined to the claimed rows, in claim order."""
    sql = compiled(queries.claim_stmt("postgresql"), "postgresql")
    assert sql.startswith("WITH RECURSIVE candidates AS (SELECT outbox.id")
    candidates = cte(sql, "candidates")
    assert candidates.endswith(
        "ORDER BY outbox.staged_at, outbox.id LIMIT __[POSTCOMPILE_window] FOR UPDATE SKIP LOCKED"
    )
    assert "parked AS (UPDATE outbox SET parked=" in sql
    claimed = cte(sql, "claimed")
    assert claimed.startswith("UPDATE outbox SET claimed_by=%(token)s::VARCHAR, claimed_at=now()")
    assert "(SELECT taken.id FROM taken WHERE" in claimed
    taken = cte(sql, "taken")
    assert taken.endswith(
        "ORDER BY candidates.staged_at, candidates.id LIMIT __[POSTCOMPILE_limit]"
    )
    # A claim that reaches its limit inside a transaction leaves that transaction whole.
    assert "later_in_tail.staged_at = (SELECT taken_end.staged_at FROM taken_end)" in sql
    assert sql.endswith("LEFT OUTER JOIN claimed ON true ORDER BY claimed.staged_at, claimed.id")


@pytest.mark.parametrize("merged", [False, True])
def test_fast_claim_takes_all_its_candidates_or_none(merged: bool) -> None:
    """The fast claim locks ``:limit`` candidates, has no per-group guard, parking or
    exclusion, and stamps them only when the gate finds nothing before them crowding."""
    stmt = (
        queries.mark_and_claim_stmt(fast=True)
        if merged
        else queries.claim_stmt("postgresql", fast=True)
    )
    sql = compiled(stmt, "postgresql")
    candidates = cte(sql, "candidates")
    assert candidates.endswith(
        "ORDER BY outbox.staged_at, outbox.id LIMIT __[POSTCOMPILE_limit] FOR UPDATE SKIP LOCKED"
    )
    for part in (" parked AS", "held_staged_at", "excluded"):
        assert part not in sql
    gate = cte(sql, "gate")
    assert "LIMIT __[POSTCOMPILE_limit] + 1" in gate
    claimed = cte(sql, "claimed")
    assert "FROM candidates WHERE NOT (SELECT gate.crowded FROM gate)" in claimed
    assert ("marked AS (UPDATE outbox SET published_at" in sql) is merged


def test_claim_limits_are_written_into_the_sql() -> None:
    """The window and the limit are SQL text (a generic plan can know them), and only ints."""
    precompiled = driver_sql.precompile(queries.claim_stmt("postgresql"), DIALECTS["postgresql"])
    assert precompiled.inline == ("limit", "window")
    text = precompiled.text({"limit": 100, "window": 400})
    assert "LIMIT 400 FOR UPDATE SKIP LOCKED" in text and "LIMIT 100" in text
    assert precompiled.text({"limit": 100, "window": 400}) is text  # rendered once
    with pytest.raises(TypeError, match="must be an int"):
        precompiled.text({"limit": "100; DROP TABLE outbox", "window": 400})


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
@pytest.mark.parametrize("order", queries.ORDERS)
def test_claim_returns_the_message_fields_then_attempts(dialect: str, order: str) -> None:
    """A claimed row maps positionally onto OutboxMessage, then its failed attempts so far
    (``input`` as text decoded row by row, except in PostgreSQL claims: see
    ``queries._MESSAGE_COLUMNS``)."""
    sql = compiled(queries.claim_stmt(dialect, order), dialect)
    if dialect == "postgresql":
        returning = ", ".join(f"outbox.{name}" for name in queries.CLAIM_FIELDS)
    else:
        returning = ", ".join(
            "CAST(input AS TEXT) AS input" if name == "input" else name
            for name in queries.CLAIM_FIELDS
        )
    assert f"RETURNING {returning}" in sql


def test_message_fields_match_the_message_tuple() -> None:
    """The claim's leading columns are OutboxMessage's fields, in its order; attempts follows."""
    assert OutboxMessage._fields == queries.MESSAGE_FIELDS
    assert (*queries.MESSAGE_FIELDS, "attempts") == queries.CLAIM_FIELDS


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
@pytest.mark.parametrize("order", queries.ORDERS)
def test_candidates_are_claimable_rows_in_claim_order(dialect: str, order: str) -> None:
    """Candidates are unpublished, not dead, not parked, due, past any retry backoff, and
    unclaimed or lapsed, in claim order (staged_at, id); the window limits them."""
    now, cutoff = ("now()", "now() - %(lease)s") if dialect == "postgresql" else ("?", "?")
    candidates = cte(compiled(queries.claim_stmt(dialect, order), dialect), "candidates")
    for condition in (
        "outbox.published_at IS NULL",
        "outbox.dead_at IS NULL",
        f"outbox.run_at <= {now}",
        f"(outbox.retry_at IS NULL OR outbox.retry_at <= {now})",
        f"(outbox.claimed_at IS NULL OR outbox.claimed_at < {cutoff})",
    ):
        assert condition in candidates
    assert "ORDER BY outbox.staged_at, outbox.id LIMIT" in candidates


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_the_claim_can_use_the_claimable_partial_index(dialect: str) -> None:
    """Every term of ix_outbox_claimable's predicate (``published_at IS NULL AND dead_at IS
    NULL AND NOT parked``) appears verbatim in the candidates' WHERE, as a planner needs to use
    a partial index (SQLite's matches terms as written), so a claim's cost follows the
    claimable backlog, not the dead letters and parked rows."""
    index = claimable_index()
    predicate = str(index.dialect_options[dialect]["where"])
    assert predicate == "published_at IS NULL AND dead_at IS NULL AND NOT parked"
    assert [c.name for c in index.columns] == ["staged_at", "id"]
    candidates = cte(compiled(queries.claim_stmt(dialect), dialect), "candidates")
    for term in predicate.split(" AND "):
        qualified = re.sub(r"\b(published_at|dead_at|parked)\b", r"outbox.\1", term)
        assert qualified in candidates, f"{qualified!r} is not a term of the candidates' WHERE"


def test_postgresql_claim_probes_the_primary_key_for_each_claimed_row() -> None:
    """``= ANY(ARRAY(...))``, not ``IN (...)``, so a large batch cannot turn into a table scan;
    the same for every statement that takes the claim's ids."""
    claimed = cte(compiled(queries.claim_stmt("postgresql"), "postgresql"), "claimed")
    assert "WHERE outbox.id = ANY (array((SELECT taken.id FROM taken" in claimed
    for stmt in (
        queries.mark_published_stmt("postgresql"),
        queries.release_stmt("postgresql"),
        queries.renew_stmt("postgresql"),
    ):
        assert "outbox.id = ANY (%(ids)s::UUID[])" in compiled(stmt, "postgresql")


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_claim_holds_back_transactions_and_keys_whose_candidates_are_not_all_their_due_rows(
    dialect: str,
) -> None:
    """The ordering guard. Per transaction (staged_at) and per ordering key among the
    candidates, the due unpublished rows up to its last candidate are counted against its
    candidates; where they differ the group or key is held. A recursive ``excluded`` CTE then
    takes the held candidates and every later candidate of their transactions and keys, and
    the claim leaves all of them out."""
    sql = compiled(queries.claim_stmt(dialect), dialect)
    assert sql.startswith("WITH RECURSIVE ")
    for part in ("staged_at", "ordering_key"):
        assert f"count(*) OVER (PARTITION BY candidates.{part})" in sql
        assert (
            f"ORDER BY candidates.staged_at DESC, candidates.id DESC) AS rn, "
            f"count(*) OVER (PARTITION BY candidates.{part}) AS size"
        ) in sql
    assert "WHERE candidates.ordering_key IS NOT NULL" in sql  # no key: nothing to wait for
    excluded = cte(sql, "excluded")
    # The recursive step: a later candidate of the same transaction or key as an excluded one.
    assert (
        "FROM candidates AS later, excluded WHERE (later.staged_at = excluded.staged_at OR "
        "later.ordering_key = excluded.ordering_key) AND (later.staged_at, later.id) > "
        "(excluded.staged_at, excluded.id)"
    ) in excluded
    assert "WHERE (candidates.id NOT IN (SELECT excluded.id FROM excluded))" in sql


def test_strict_order_claims_nothing_after_the_first_failed_row() -> None:
    """order="strict": the candidates end at the first unpublished, due row with a failed
    attempt (whichever relay retries it); order="key" has no such bound."""
    strict = cte(compiled(queries.claim_stmt("postgresql", "strict"), "postgresql"), "candidates")
    assert "failing.attempts >" in strict
    assert "ORDER BY failing.staged_at, failing.id LIMIT 1" in strict
    assert "(outbox.staged_at, outbox.id) <= (SELECT failing.staged_at, failing.id" in strict
    assert "failing" not in compiled(queries.claim_stmt("postgresql", "key"), "postgresql")


# --- after the claim: fenced -------------------------------------------------------------------


def _updates_after_the_claim(dialect: str) -> dict[str, str]:
    """The WHERE of every statement that changes claimed rows, by name."""
    sql = {
        "mark": compiled(queries.mark_published_stmt(dialect), dialect),
        "release": compiled(queries.release_stmt(dialect), dialect),
        "fail": compiled(queries.fail_stmt(dialect), dialect),
        "renew": compiled(queries.renew_stmt(dialect), dialect),
    }
    if dialect == "postgresql":
        sql["mark"] = cte(sql["mark"], "marked")
    return {name: text.partition(" WHERE ")[2] for name, text in sql.items()}


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_every_update_after_the_claim_is_fenced(dialect: str) -> None:
    """Mark, release, charge and renew touch only rows still carrying this claim's token and
    unpublished, so a relay that stalled past its lease changes nothing another relay holds."""
    param = "%(token)s::VARCHAR" if dialect == "postgresql" else "?"
    token = f"outbox.claimed_by = {param}"
    for name, where in _updates_after_the_claim(dialect).items():
        assert token in where, name
        assert "outbox.published_at IS NULL" in where, name


def test_mark_and_claim_fences_the_mark_and_keeps_the_claim_off_its_rows() -> None:
    """The previous claim's mark and the next claim share one statement: the mark is fenced on
    the previous token and unparks what its rows held back; the claim neither takes the rows
    being marked nor waits for them (the ordering guard counts them as published); the result
    leads with the mark's counts and always has a row."""
    sql = compiled(queries.mark_and_claim_stmt(), "postgresql")
    assert sql.startswith(
        "WITH RECURSIVE marked AS (UPDATE outbox SET published_at=now() "
        "WHERE outbox.claimed_by = %(previous_token)s::VARCHAR AND outbox.published_at IS NULL "
        "AND outbox.id = ANY (%(previous_ids)s::UUID[])"
    )
    unparked = cte(sql, "unparked")
    assert unparked.startswith("UPDATE outbox SET parked=")
    # Nothing to do while nothing is parked (the first entry of ix_outbox_parked_group, never an
    # EXISTS that PostgreSQL may read the table for); else the parked rows of the marked rows'
    # transactions and keys, probed for from each of them (never a filter on every parked row),
    # but not those parked until they are due (only a sweep wakes them).
    assert (
        "WHERE (SELECT some_parked.staged_at FROM outbox AS some_parked WHERE some_parked.parked "
        "ORDER BY some_parked.staged_at LIMIT 1) IS NOT NULL" in unparked
    )
    for column in ("staged_at", "ordering_key"):
        assert (
            f"FROM (SELECT DISTINCT marked.{column} AS {column} FROM marked "
            f"WHERE marked.{column} IS NOT NULL) AS by_{column} JOIN LATERAL "
            f"(SELECT parked_row.id AS id FROM outbox AS parked_row WHERE parked_row.parked "
            f"AND parked_row.wake_at IS NULL "
            f"AND parked_row.{column} = by_{column}.{column} LIMIT ALL OFFSET 0)"
        ) in unparked
    candidates = cte(sql, "candidates")
    assert "AND outbox.claimed_by IS DISTINCT FROM %(previous_token)s" in candidates
    # The guard's counts, per transaction and per key, treat the rows being marked as published.
    guard = re.findall(r"\w+_row\.claimed_by IS DISTINCT FROM %\(previous_token\)s", sql)
    assert {g.partition(".")[0] for g in guard} >= {"staged_at_row", "ordering_key_row"}
    assert "claimed AS (UPDATE outbox SET claimed_by=%(token)s" in sql
    header = r"SELECT (\w+)\.marked, \1\.unparked, \1\.parked, \1\.held, \1\.crowded, claimed\.id"
    assert re.search(header, sql)
    assert sql.endswith("LEFT OUTER JOIN claimed ON true ORDER BY claimed.staged_at, claimed.id")
    assert "IS DISTINCT FROM" not in compiled(queries.claim_stmt("postgresql"), "postgresql")


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_fail_charges_an_attempt_and_sets_a_backoff_or_a_dead_letter(dialect: str) -> None:
    """The charge hands the row back (lease cleared), adds one attempt, records the error, and
    sets either retry_at (now + delay on PostgreSQL's clock; the relay's instant on SQLite) or,
    when the row gives up, dead_at, never both."""
    sql = compiled(queries.fail_stmt(dialect), dialect)
    if dialect == "postgresql":
        dead, now, retry_at = "%(dead)s", "now()", "now() + %(delay)s"
        row_id = "outbox.id = %(failed_id)s::UUID"
    else:
        dead, now, retry_at, row_id = "?", "?", "?", "outbox.id = ?"
    assert sql.startswith("UPDATE outbox SET claimed_by=NULL, claimed_at=NULL, ")
    assert re.search(rf"attempts=\(outbox\.attempts \+ ({PG_PARAM}|\?)\)", sql)
    assert re.search(rf"last_error=({PG_PARAM}|\?)", sql)
    assert f"retry_at=CASE WHEN {dead} THEN NULL ELSE {retry_at} END" in sql
    assert f"dead_at=CASE WHEN {dead} THEN {now} ELSE NULL END" in sql
    assert sql.partition(" WHERE ")[2].startswith(row_id)


# --- the clocks ----------------------------------------------------------------------------------


def test_sqlite_statements_use_the_relays_clock() -> None:
    """SQLite has no server clock and no row locks; its statements compare against bound
    now/cutoff values and lock nothing."""
    for stmt in (
        queries.claim_stmt("sqlite"),
        queries.park_stmt("sqlite"),
        queries.fail_stmt("sqlite"),
        queries.renew_stmt("sqlite"),
        queries.sweep_parked_stmt("sqlite"),
        queries.park_waiting_stmt("sqlite"),
        queries.wake_stmt("sqlite"),
    ):
        sql = compiled(stmt, "sqlite")
        assert "FOR UPDATE" not in sql and "now()" not in sql
    assert "RETURNING" in compiled(queries.claim_stmt("sqlite"), "sqlite")


def test_numbered_sql_numbers_each_parameter_once() -> None:
    """psycopg's own conversion, done once: a name used twice keeps its number, ``%%`` is a
    ``%`` again, and ``%(name)b`` (binary) becomes a plain number too."""
    numbered = driver_sql._numbered("a %% b %(x)s %(y)b %(x)s")
    assert numbered == ("a % b $1 $2 $1", ("x", "y"), frozenset({"y"}))


def test_numbered_claims_send_every_parameter_in_order() -> None:
    """The claim carrying a whole write-back, as the relay sends it numbered: no named
    placeholder is left, each number has its value in :meth:`values`, the claim's UUID
    arrays travel binary and the statement's own constants are filled in."""
    dialect = DIALECTS["postgresql"]
    precompiled = driver_sql.precompile(queries.mark_and_claim_stmt(settle=True), dialect)
    params = {
        "limit": 100,
        "window": 100,
        "lease": None,
        "token": "t",
        "previous_token": "p",
        "previous_ids": [],
        "handed_ids": [],
        "errors": [],
        "delays": [],
        "deads": [],
        "parks": [],
    }
    sql = precompiled.text(params, numbered=True)
    assert "%(" not in sql
    numbers = {int(n) for n in re.findall(r"\$(\d+)", sql)}
    values = precompiled.values(params)
    assert numbers == set(range(1, len(values) + 1))
    assert {"previous_ids", "handed_ids"} <= precompiled.binary
    for name, value in zip(precompiled.names, values, strict=True):
        assert isinstance(value, driver_sql._BinaryArray) == (name in precompiled.binary)
        assert value == params.get(name, precompiled.constants.get(name))


def test_a_sweep_parks_only_unclaimed_rows_not_due_and_wakes_by_wake_at() -> None:
    """Parking until due touches only claimable, unclaimed rows whose due time (the later of
    ``run_at`` and ``retry_at``) is past the horizon, read from the head of the claim index in
    claim order, and on PostgreSQL locks only the rows it parks (``SKIP LOCKED``, not the
    head's); waking reads ``wake_at`` as ``ix_outbox_waking``'s predicate says it. Neither the
    holders' unparking nor the sweep for held-back rows unparks a row with a ``wake_at``."""
    park = compiled(queries.park_waiting_stmt("postgresql"), "postgresql")
    assert park.startswith("UPDATE outbox SET parked=")
    assert "wake_at=CASE WHEN (outbox.retry_at > outbox.run_at) THEN outbox.retry_at" in park
    assert "waiting_row.claimed_by IS NULL" in park
    assert "> now() + %(park_ahead)s" in park
    assert "ORDER BY head_row.staged_at, head_row.id LIMIT __[POSTCOMPILE_head]" in park
    assert park.endswith("FOR UPDATE OF waiting_row SKIP LOCKED)))")
    wake = compiled(queries.wake_stmt("sqlite"), "sqlite")
    assert "outbox.wake_at IS NOT NULL AND outbox.wake_at <= ?" in wake
    assert "SET parked=?, wake_at=NULL" in wake
    for statement in (queries.sweep_parked_stmt("sqlite"), queries.unpark_behind_stmt("sqlite")):
        assert "parked_row.wake_at IS NULL" in compiled(statement, "sqlite")
