"""The relay's SQL, compiled without a database: the properties that must never regress."""

from __future__ import annotations

from sqlalchemy.dialects import postgresql, sqlite

from sqla_outbox import queries
from sqla_outbox.message import OutboxMessage


def compiled(stmt: object, dialect: object) -> str:
    return " ".join(str(stmt.compile(dialect=dialect)).split())  # type: ignore[attr-defined]


def test_postgresql_claim_locks_and_stamps_in_one_statement() -> None:
    """The claim is one UPDATE over a FOR UPDATE SKIP LOCKED subselect, in claim order."""
    sql = compiled(queries.claim_stmt("postgresql"), postgresql.dialect())
    assert sql.startswith("WITH candidates AS (SELECT outbox.id")
    assert "claimed AS (UPDATE outbox SET claimed_by=" in sql
    assert sql.endswith("FROM claimed ORDER BY claimed.staged_at, claimed.id")
    assert "claimed_at=now()" in sql
    assert "FOR UPDATE SKIP LOCKED" in sql
    assert "ORDER BY outbox.staged_at, outbox.id" in sql
    assert "outbox.published_at IS NULL AND outbox.run_at <= now()" in sql
    assert "RETURNING outbox.id" in sql


def test_sqlite_claim_uses_relay_clock() -> None:
    """SQLite has no server clock; the claim compares against bound now/cutoff values."""
    sql = compiled(queries.claim_stmt("sqlite"), sqlite.dialect())
    assert "FOR UPDATE" not in sql
    assert "now()" not in sql and "RETURNING" in sql


def test_every_update_after_the_claim_is_fenced() -> None:
    """Mark and release only touch rows still carrying this claim's token, unpublished."""
    for stmt in (queries.mark_published_stmt("postgresql"), queries.release_stmt()):
        sql = compiled(stmt, postgresql.dialect())
        assert "WHERE outbox.claimed_by = %(token)s" in sql
        assert "outbox.published_at IS NULL" in sql


def test_message_fields_match_the_message_dataclass() -> None:
    """A claimed row maps positionally onto OutboxMessage."""
    assert OutboxMessage._fields == queries.MESSAGE_FIELDS


def test_claim_holds_back_a_transaction_whose_candidates_are_not_all_its_due_rows() -> None:
    """A staged_at group is claimed only if its candidates are every due unpublished row of it
    up to the claim's last row: one count per group, against the group's candidate count."""
    sql = compiled(queries.claim_stmt("postgresql"), postgresql.dialect())
    assert "count(*) AS size FROM candidates GROUP BY candidates.staged_at" in sql
    assert "ORDER BY candidates.staged_at DESC, candidates.id DESC LIMIT" in sql
    assert (
        "WHERE group_row.staged_at = groups.staged_at AND (group_row.staged_at, group_row.id)"
        " <= (SELECT claim_end.staged_at, claim_end.id FROM claim_end)"
    ) in sql
    assert "!= groups.size" in sql


def test_postgresql_claim_probes_the_primary_key_for_each_claimed_row() -> None:
    """``= ANY(ARRAY(...))``, not ``IN (...)``, so a large batch cannot turn into a table scan."""
    sql = compiled(queries.claim_stmt("postgresql"), postgresql.dialect())
    assert "WHERE outbox.id = ANY (array((SELECT candidates.id" in sql


def test_mark_and_claim_fences_the_mark_and_keeps_the_claim_off_its_rows() -> None:
    """The previous claim's mark and the next claim share one statement: the mark is fenced on
    the previous token; the claim neither takes the rows being marked nor waits for them; the
    result leads with the mark's count and always has a row."""
    sql = compiled(queries.mark_and_claim_stmt(), postgresql.dialect())
    assert sql.startswith(
        "WITH marked AS (UPDATE outbox SET published_at=now() "
        "WHERE outbox.claimed_by = %(previous_token)s::VARCHAR AND outbox.published_at IS NULL"
    )
    assert "(outbox.staged_at, outbox.id) >= (%(previous_first_staged_at)s" in sql
    assert "(outbox.staged_at, outbox.id) <= (%(previous_last_staged_at)s" in sql
    assert "AND outbox.claimed_by IS DISTINCT FROM %(previous_token)s" in sql  # candidates
    assert "AND group_row.claimed_by IS DISTINCT FROM %(previous_token)s" in sql  # the guard
    assert "claimed AS (UPDATE outbox SET claimed_by=%(token)s" in sql
    assert "SELECT marks.marked, claimed.id, claimed.job" in sql
    assert sql.endswith(
        "FROM (SELECT count(*) AS marked FROM marked) AS marks "
        "LEFT OUTER JOIN claimed ON true ORDER BY claimed.staged_at, claimed.id"
    )
    assert "IS DISTINCT FROM" not in compiled(
        queries.claim_stmt("postgresql"), postgresql.dialect()
    )
