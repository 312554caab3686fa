"""The ``sqla-outbox`` console script, run as a real subprocess against real databases.

What an operator sees is the contract here: exit codes, one-sentence errors with the fix and no
traceback, passwords hidden, JSON lines on stdout, structured logs on stderr, and a relay that
finishes its pass on SIGTERM. The publisher-spec loader and ``StdoutPublisher`` are pinned
in-process at the end, where a subprocess would add nothing.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from support import (
    REPO,
    assert_one_clean_error,
    cli_command,
    cli_env,
    error_lines,
    run_cli,
    stage_inputs,
    url_of,
)

import sqla_outbox as outbox
from sqla_outbox.cli import main
from sqla_outbox.errors import PublisherError
from sqla_outbox.publishers.loader import resolve_publisher
from sqla_outbox.publishers.schemes import BROKERS
from sqla_outbox.publishers.stdout import StdoutPublisher

HELPERS = "tests.publishers_for_tests"
MESSAGE_KEYS = {
    "id",
    "job",
    "queue",
    "input",
    "idempotency_key",
    "max_attempts",
    "run_at",
    "staged_at",
    "tenant_id",
    "traceparent",
    "enqueued_by",
    "ordering_key",
}
SLOW_RETRIES = ("--retry-base", "60", "--retry-max", "60")
"""Relay flags that keep a failed message backing off for the rest of a test's --once run."""


# --- helpers -----------------------------------------------------------------------------------


def stage(
    engine: Engine, *inputs: dict[str, Any], job: str = "send_receipt", **kw: Any
) -> list[outbox.OutboxMessage]:
    """Enqueue one message per input in one committed transaction; return them in order."""
    return stage_inputs(engine, job, inputs, **kw)


def stage_rolled_back(engine: Engine, *inputs: dict[str, Any]) -> list[outbox.OutboxMessage]:
    """Enqueue in a transaction that rolls back; none of these may ever be published."""
    return stage_inputs(engine, "never", inputs, commit=False)


def published_ids(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as conn:
        stmt = select(outbox.OutboxRow.id).where(outbox.OutboxRow.published_at.is_not(None))
        return set(conn.scalars(stmt))


def all_rows(engine: Engine) -> list[outbox.OutboxRow]:
    with Session(engine) as session:
        stmt = select(outbox.OutboxRow).order_by(outbox.OutboxRow.staged_at, outbox.OutboxRow.id)
        return list(session.scalars(stmt))


@pytest.fixture
def database_without_table(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of a reachable database with no outbox table (PostgreSQL, or an SQLite file)."""
    if request.param == "postgresql":
        url: URL = request.getfixturevalue("pg_url")
        return url.render_as_string(hide_password=False)
    path = tmp_path / "app.sqlite3"
    engine = outbox.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    engine.dispose()
    return f"sqlite:///{path}"


# --- relay --once ------------------------------------------------------------------------------


def test_relay_once_prints_each_committed_message_in_order(engine: Engine) -> None:
    """`relay --once --publisher stdout` prints one JSON line per committed message, in enqueue
    order, nothing from rolled-back work (transaction or savepoint), marks them all published
    and exits 0; settings come from the environment variables."""
    first = stage(engine, {"n": 1}, {"n": 2}, {"n": 3})
    stage_rolled_back(engine, {"n": "lost"})
    with Session(engine) as session, session.begin():
        kept = outbox.enqueue(session, "send_receipt", {"n": 4})
        nested = session.begin_nested()
        outbox.enqueue(session, "never", {"n": "savepoint"})
        nested.rollback()
    last = stage(engine, {"n": 5}, {"n": 6})
    expected = [*first, kept, *last]

    result = run_cli("relay", "--once", url=url_of(engine), publisher="stdout", batch_size="4")

    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["id"] for line in lines] == [str(m.id) for m in expected]
    assert all(set(line) == MESSAGE_KEYS for line in lines)
    assert [line["input"]["n"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert published_ids(engine) == {m.id for m in expected}
    assert len(all_rows(engine)) == len(expected)
    assert "event=relay.once_done" in result.stderr
    assert "published=6" in result.stderr


def test_relay_once_exits_1_when_a_publish_fails(engine: Engine) -> None:
    """Under --once a failed publish exits 1 and the log names the message. By design (schema
    2) the run goes on past it: the failed message is charged an attempt (last_error, and a
    retry_at one --retry-base ahead) and holds back only the later message of its ordering key
    (order holds there), while the messages before it and a later one of another transaction
    and no key are published."""
    ok = stage(engine, {"n": 1})
    bad = stage(engine, {"fail": True}, ordering_key="order-7")
    same_key = stage(engine, {"n": 3}, ordering_key="order-7")
    other = stage(engine, {"n": 4})
    started = dt.datetime.now(dt.timezone.utc)

    result = run_cli(
        "relay",
        "--once",
        *SLOW_RETRIES,
        url=url_of(engine),
        publisher=f"{HELPERS}:fail_on_flag",
    )

    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    printed = [json.loads(line)["id"] for line in result.stdout.splitlines()]
    assert printed == [str(ok[0].id), str(other[0].id)]
    assert "event=relay.publish_failed" in result.stderr
    assert str(bad[0].id) in result.stderr
    assert "failed=True" in result.stderr
    assert published_ids(engine) == {ok[0].id, other[0].id}
    failed_row = next(row for row in all_rows(engine) if row.id == bad[0].id)
    assert failed_row.attempts == 1
    assert failed_row.claimed_by is None
    assert failed_row.dead_at is None
    assert "broker rejected" in failed_row.last_error
    assert failed_row.retry_at >= started + dt.timedelta(seconds=50)
    assert same_key[0].id not in published_ids(engine)


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("database_without_table", ["postgresql", "sqlite"], indirect=True)
@pytest.mark.parametrize("command", ["relay", "status"])
def test_missing_table_names_the_fix(database_without_table: str, command: str) -> None:
    """Against a database without the outbox table, `relay` and `status` exit 1 with one
    sentence naming both fixes (a migration with op.create_outbox_table(version=N), N being
    outbox.SCHEMA_VERSION, alembic upgrade head), and no traceback."""
    result = run_cli(command, url=database_without_table, publisher="stdout")

    assert result.returncode == 1
    line = assert_one_clean_error(result)
    assert "alembic upgrade head" in line
    assert f"op.create_outbox_table(version={outbox.SCHEMA_VERSION})" in line


@pytest.mark.parametrize(
    ("flag", "value", "rule"),
    [
        ("--claim-lease", "0", "positive, finite number of seconds"),
        ("--claim-lease", "inf", "positive, finite number of seconds"),
        ("--batch-size", "0", "positive whole number"),
        ("--poll-interval", "-1", "positive, finite number of seconds"),
        ("--retry-base", "0", "positive, finite number of seconds"),
        ("--retry-max", "nan", "positive, finite number of seconds"),
        ("--max-publish-attempts", "0", "at least 1, or --max-publish-attempts never to"),
    ],
)
def test_bad_numbers_are_usage_errors_naming_the_flag(
    sqlite_engine: Engine, flag: str, value: str, rule: str
) -> None:
    """A number the relay cannot honour is refused before anything runs: exit 2, one sentence
    naming the flag (not the Python argument), the value, the rule and an example fix."""
    result = run_cli("relay", "--publisher", "stdout", flag, value, url=url_of(sqlite_engine))

    assert result.returncode == 2
    line = assert_one_clean_error(result)
    assert line.startswith(f"Error: {flag} must be")
    assert rule in line
    assert value in line
    assert f"Pass e.g. {flag} " in line
    assert "_" not in line.split(" must")[0]


def test_bad_number_from_the_environment_names_the_variable(sqlite_engine: Engine) -> None:
    """A bad value read from SQLA_OUTBOX_CLAIM_LEASE names the variable as well as the flag, so
    the operator looks in the deployment's environment, not at a command line they never typed."""
    result = run_cli("relay", url=url_of(sqlite_engine), publisher="stdout", claim_lease="0")

    assert result.returncode == 2
    line = assert_one_clean_error(result)
    assert "--claim-lease (from SQLA_OUTBOX_CLAIM_LEASE) must be" in line


def test_retry_max_below_retry_base_names_both_flags(sqlite_engine: Engine) -> None:
    """--retry-max below --retry-base is refused by the Relay's own check, reworded so that
    every argument it names reads as the flag the operator typed."""
    result = run_cli(
        "relay",
        "--retry-base",
        "10",
        "--retry-max",
        "5",
        url=url_of(sqlite_engine),
        publisher="stdout",
    )

    assert result.returncode == 2
    line = assert_one_clean_error(result)
    assert line.startswith("Error: --retry-max must be at least --retry-base, got --retry-max 5")
    assert "--retry-base 10" in line
    assert "_" not in line


def test_bad_order_names_the_flag_and_both_choices(sqlite_engine: Engine) -> None:
    """`--order sideways` (here from SQLA_OUTBOX_ORDER) is refused by the Relay's check: one
    sentence naming the flag and its variable, the value, and both choices; the words
    "ordering key" in it are left alone."""
    result = run_cli("relay", url=url_of(sqlite_engine), publisher="stdout", order="sideways")

    assert result.returncode == 2
    line = assert_one_clean_error(result)
    assert line.startswith("Error: --order (from SQLA_OUTBOX_ORDER) must be 'key' or 'strict'")
    assert "'sideways'" in line
    assert "Pass --order key (" in line and "or --order strict (" in line
    assert "ordering key" in line


def test_max_publish_attempts_takes_never_and_refuses_other_words(sqlite_engine: Engine) -> None:
    """--max-publish-attempts takes a whole number or 'never' (retry for ever); any other word
    is a usage error naming the value and both forms."""
    stage(sqlite_engine, {"n": 1})

    never = run_cli(
        "relay",
        "--once",
        "--max-publish-attempts",
        "NEVER",
        url=url_of(sqlite_engine),
        publisher="stdout",
    )
    word = run_cli(
        "relay",
        "--once",
        "--max-publish-attempts",
        "ten",
        url=url_of(sqlite_engine),
        publisher="stdout",
    )

    assert never.returncode == 0, never.stderr
    assert word.returncode == 2
    line = assert_one_clean_error(word)
    assert "--max-publish-attempts" in line
    assert "'ten' is neither a whole number nor 'never'" in line


def test_max_publish_attempts_from_the_environment_makes_a_dead_letter(engine: Engine) -> None:
    """With SQLA_OUTBOX_MAX_PUBLISH_ATTEMPTS=1 one refused publish makes the message a dead
    letter (dead_at set, no retry_at), logged as relay.dead_letter; the run still publishes the
    message of another transaction after it, and exits 1."""
    [bad] = stage(engine, {"fail": True})
    [after] = stage(engine, {"n": 2})

    result = run_cli(
        "relay",
        "--once",
        url=url_of(engine),
        publisher=f"{HELPERS}:fail_on_flag",
        max_publish_attempts="1",
    )

    assert result.returncode == 1, result.stderr
    assert "event=relay.dead_letter" in result.stderr
    rows = {row.id: row for row in all_rows(engine)}
    assert rows[bad.id].dead_at is not None
    assert rows[bad.id].retry_at is None
    assert rows[bad.id].attempts == 1
    assert published_ids(engine) == {after.id}


def test_order_strict_publishes_nothing_after_a_failure(engine: Engine) -> None:
    """`--order strict` keeps the total order: after a refused message nothing later is
    published in that run, whatever its transaction or key; the default (`key`) lets the later
    message of another transaction flow (see test_relay_once_exits_1_when_a_publish_fails)."""
    [ok] = stage(engine, {"n": 1})
    stage(engine, {"fail": True})
    stage(engine, {"n": 3})

    result = run_cli(
        "relay",
        "--once",
        "--order",
        "strict",
        *SLOW_RETRIES,
        url=url_of(engine),
        publisher=f"{HELPERS}:fail_on_flag",
    )

    assert result.returncode == 1, result.stderr
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [str(ok.id)]
    assert published_ids(engine) == {ok.id}


def test_unimportable_publisher_is_one_sentence(sqlite_engine: Engine) -> None:
    """`--publisher nosuchmodule:thing` exits non-zero with one sentence naming the module and
    the fix (spelling / PYTHONPATH / install), and no traceback."""
    result = run_cli(
        "relay", "--once", "--publisher", "nosuchmodule:thing", url=url_of(sqlite_engine)
    )

    line = assert_one_clean_error(result)
    assert "'nosuchmodule'" in line
    assert "PYTHONPATH" in line


@pytest.mark.parametrize("command", ["relay", "status"])
def test_unreachable_database_is_one_sentence_with_the_password_hidden(command: str) -> None:
    """A database that refuses connections gives `Cannot connect to <url>: <driver's first
    line>. Check --url / SQLA_OUTBOX_URL ...`, exit 1, and the password appears nowhere."""
    url = "postgresql+psycopg://postgres:secret@127.0.0.1:1/outbox"

    result = run_cli(
        command, "--once" if command == "relay" else "--json", url=url, publisher="stdout"
    )

    assert result.returncode == 1
    line = assert_one_clean_error(result)
    assert line.startswith(
        "Error: Cannot connect to postgresql+psycopg://postgres:***@127.0.0.1:1/outbox: "
    )
    assert line.endswith("Check --url / SQLA_OUTBOX_URL and that the server is running.")
    assert "secret" not in result.stdout + result.stderr


MALFORMED_URLS = [
    ("postgresql+psycopg://app:hunter2@db:abc/shop", "its port must be a whole number"),
    ("postgresql+psycopg://app:hunter2@db:/shop", "its port must be a whole number"),
    ("postgresql+psycopg://app:hunter2@[::1/shop", "its IPv6 host has no closing ']'"),
    ("postgresql+psycopg://app:hunter2@db:0/shop", "has the port 0, which is not from 1"),
    ("postgresql+psycopg://app:hun@ter2@db/shop", "write it as %40"),
    ("postgres://app:hunter2@db/shop", "write postgresql+psycopg:// instead"),
    ("foo://x", "is for 'foo', which sqla-outbox does not support"),
    ("mssql+pyodbc://app:hunter2@db/shop", "is for 'mssql', which sqla-outbox does not"),
    ("redis://localhost:6379/0", "is for 'redis', which sqla-outbox does not"),
    ("postgresql+nosuch://app:hunter2@db/shop", "names the driver 'nosuch'"),
    ("postgresql+psycopg2cffi://app:hunter2@db/shop", "needs the driver module 'psycopg2cffi'"),
    ("postgresql+asyncpg://app:hunter2@db/shop", "'postgresql+psycopg://app:***@db/shop' instead"),
    ("sqlite+aiosqlite://", "is an in-memory SQLite database behind an asyncio driver"),
    ("garbage", "'garbage' is not a database URL"),
    ("://", "is not a database URL"),
    ("app:hunter2@db/shop", "'<unparseable database URL>' is not a database URL"),
    ("  ", "is not a database URL"),
]


@pytest.mark.parametrize("command", ["relay", "status"])
@pytest.mark.parametrize(("url", "expected"), MALFORMED_URLS)
def test_malformed_urls_are_one_usage_error_without_the_password(
    command: str, url: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every malformed --url (bad or empty port, an unescaped '@', an unknown or unsupported
    dialect, an unknown, missing or asyncio-only driver, garbage) is a usage error before
    anything connects: exit 2, exactly one `Error: --url '<url>' ...` line with the password
    hidden, no traceback."""
    args = [command, "--url", url]
    if command == "relay":
        args += ["--publisher", "stdout", "--once"]

    code = main(args)

    captured = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in captured.err
    [line] = error_lines(captured.err)
    assert line.startswith("Error: --url '")
    assert expected in line
    assert "ter2" not in captured.out + captured.err
    assert captured.out == ""


def test_url_from_the_environment_is_named_as_such() -> None:
    """A malformed URL read from SQLA_OUTBOX_URL says so, so the operator looks in the
    deployment's environment; run as a real process, it prints no traceback."""
    result = run_cli("status", url="postgresql+psycopg://app:hunter2@db:abc/shop")

    assert result.returncode == 2
    line = assert_one_clean_error(result)
    assert line.startswith(
        "Error: --url (from SQLA_OUTBOX_URL) 'postgresql+psycopg://app:***@db:abc/shop' is not "
        "a database URL"
    )
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [["relay", "--once", "--publisher", "stdout"], ["status"], ["purge", "--older-than", "7d"],
     ["dead", "list"]],
)  # fmt: skip
def test_commands_on_mysql_without_its_driver_name_pymysql(command: list[str]) -> None:
    """Every command takes a MySQL URL; one naming mysqlclient (mysql://), which is not
    installed, is a usage error before connecting that names the module and the PyMySQL URL to
    use instead."""
    result = run_cli(*command, url="mysql://root:hunter2@127.0.0.1:3306/mysql")

    assert result.returncode == 2
    line = assert_one_clean_error(result)
    assert "needs the driver module 'MySQLdb', which is not installed" in line
    assert line.endswith("use 'mysql+pymysql://root:***@127.0.0.1:3306/mysql' instead.")
    assert "hunter2" not in result.stderr


def test_missing_url_names_the_flag_and_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --url or SQLA_OUTBOX_URL, main() returns 2 and says where the URL can come from;
    it returns the code rather than exiting, so it can be called in-process."""
    monkeypatch.delenv("SQLA_OUTBOX_URL", raising=False)

    code = main(["relay", "--publisher", "stdout"])

    assert code == 2
    err = capsys.readouterr().err
    assert "--url" in err
    assert "SQLA_OUTBOX_URL" in err


def test_help_lists_every_environment_variable(capsys: pytest.CaptureFixture[str]) -> None:
    """`relay --help` shows the environment variable behind every option and exits 0."""
    assert main(["relay", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    names = (
        "URL",
        "PUBLISHER",
        "BATCH_SIZE",
        "POLL_INTERVAL",
        "CLAIM_LEASE",
        "RELAY_ID",
        "ORDER",
        "MAX_PUBLISH_ATTEMPTS",
        "RETRY_BASE",
        "RETRY_MAX",
    )
    for name in names:
        assert f"SQLA_OUTBOX_{name}" in out


def test_help_lists_every_publisher_form(capsys: pytest.CaptureFixture[str]) -> None:
    """`relay --help` lists each accepted --publisher form, one per line (stdout,
    module:attribute, celery:module:app, and every broker URL scheme the loader accepts) with
    the extra each broker needs, and no line is wider than the 100 columns click is given."""
    assert main(["relay", "--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()

    for form in ("stdout", "module:attribute", "celery:module:app"):
        assert any(line.strip().startswith(form) for line in lines), form
    listed = {line.strip(): line for line in lines if line.rstrip().endswith("]")}
    for scheme, broker in BROKERS.items():
        form = "celery:module:app" if scheme == "celery" else f"{scheme}://"
        [line] = [text for text in listed if f" {form}" in f" {text}"]
        assert line.endswith(f"broker [{broker.extra}]")
    assert 'pip install "sqla-outbox[redis]"' in out
    assert max(len(line) for line in lines) <= 100


# --- status ------------------------------------------------------------------------------------


def test_status_reports_pending_due_and_failing(engine: Engine) -> None:
    """After a --once run that publishes two messages and fails on the third, `status --json`
    reports what is left: pending counts the failed row, the later row of its ordering key
    (held back, parked), the row scheduled in an hour and one staged after the run; due counts
    only that last one (not the failed row backing off, the parked one or the scheduled one);
    failing and backing_off count the failed row, which `holding` lists with its key, attempts,
    retry_at and last error. The table prints the same."""
    stage(engine, {"n": 1}, {"n": 2})
    [bad] = stage(engine, {"fail": True}, ordering_key="order-7")
    stage(engine, {"n": 4}, ordering_key="order-7")
    stage(engine, {"n": 5}, run_at=dt.timedelta(hours=1))
    once = run_cli(
        "relay", "--once", *SLOW_RETRIES, url=url_of(engine), publisher=f"{HELPERS}:fail_on_flag"
    )
    assert once.returncode == 1
    stage(engine, {"n": 6})

    result = run_cli("status", "--json", url=url_of(engine))

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["pending"] == 4
    assert report["due"] == 1
    assert report["failing"] == 1
    assert report["backing_off"] == 1
    assert report["dead"] == 0
    assert report["parked"] == 1
    assert report["relays"] == []
    assert report["oldest_pending_age_seconds"] >= 0
    [holding] = report["holding"]
    assert holding["id"] == str(bad.id)
    assert holding["ordering_key"] == "order-7"
    assert holding["attempts"] == 1
    assert holding["state"] == "backing_off"
    assert dt.datetime.fromisoformat(holding["retry_at"]) > dt.datetime.now(dt.timezone.utc)
    assert holding["dead_at"] is None
    assert "broker rejected" in holding["last_error"]
    # The library's status() is the object the command prints.
    library = outbox.status(engine).to_dict()
    assert library.pop("oldest_pending_age_seconds") >= report.pop("oldest_pending_age_seconds")
    assert library == report

    table = run_cli("status", url=url_of(engine))
    assert table.returncode == 0, table.stderr
    assert re.search(r"pending \(unpublished\)\s+4$", table.stdout, re.MULTILINE)
    assert re.search(r"due now\s+1$", table.stdout, re.MULTILINE)
    assert re.search(r"with failed attempts\s+1$", table.stdout, re.MULTILINE)
    assert re.search(r"backing off \(retrying\)\s+1$", table.stdout, re.MULTILINE)
    assert re.search(r"dead letters\s+0$", table.stdout, re.MULTILINE)
    assert re.search(r"parked \(held back\)\s+1$", table.stdout, re.MULTILINE)
    assert re.search(
        rf"^\s+{bad.id}\s+send_receipt\s+order-7\s+1\s+backing off\s+RuntimeError: broker",
        table.stdout,
        re.MULTILINE,
    )
    assert "Live claims: none" in table.stdout


def test_status_shows_live_claims_per_relay(engine: Engine) -> None:
    """While a relay is publishing a claimed batch, `status` shows that relay by id (the fence
    token's suffix stripped) with the rows it holds and the claim's age, not yet lapsed."""
    stage(engine, *({"n": n} for n in range(5)))
    seen: list[subprocess.CompletedProcess[str]] = []

    def publish(message: outbox.OutboxMessage) -> None:
        if not seen:  # mid-pass: the claim is committed and held
            seen.append(run_cli("status", "--json", url=url_of(engine)))
            seen.append(run_cli("status", url=url_of(engine)))

    relay = outbox.Relay(engine, publish, batch_size=3, relay_id="relay-under-test")
    try:
        assert relay.tick() == 3
    finally:
        if relay.engine is not engine:
            relay.engine.dispose()

    as_json, table = seen
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["pending"] == 5
    [claims] = report["relays"]
    assert claims["relay_id"] == "relay-under-test"
    assert claims["claims"] == 1
    assert claims["rows_held"] == 3
    assert 0 <= claims["claim_age_seconds"] < 30
    assert claims["lapsed"] is False
    assert re.search(r"^\s+relay-under-test\s+1\s+3\s+[\d.]+ s$", table.stdout, re.MULTILINE)


# --- demo --------------------------------------------------------------------------------------


def test_demo_tells_the_whole_story() -> None:
    """`sqla-outbox demo` needs no arguments, exits 0, shows both relays publishing JSON lines,
    states that nothing rolled back was published, and removes its temporary database."""
    result = run_cli("demo")

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ROLLBACK" in out
    assert "SAVEPOINT" in out
    assert "Rolled-back check passed" in out
    published = [line.strip() for line in out.splitlines() if " | {" in line]
    relays = {line.split(" | ", 1)[0] for line in published}
    assert relays <= {"relay-a", "relay-b"}
    assert "relay-a" in out
    assert "relay-b" in out
    jobs = [json.loads(line.split(" | ", 1)[1])["input"]["order_id"] for line in published]
    assert sorted(jobs) == [1, 2, 3, 4, 5, 6, 8]
    match = re.search(r"embedded SQLite at (\S+)", out)
    assert match
    assert not Path(match.group(1)).exists()


# --- signals -----------------------------------------------------------------------------------


@pytest.fixture
def stdout_lines() -> Iterator[tuple[queue.Queue[str | None], list[threading.Thread]]]:
    """A queue fed by a reader thread, so the test can wait for a line with a timeout."""
    lines: queue.Queue[str | None] = queue.Queue()
    threads: list[threading.Thread] = []
    yield lines, threads
    for thread in threads:
        thread.join(timeout=10)


def test_sigterm_finishes_the_pass_and_exits_0(
    engine: Engine,
    tmp_path: Path,
    stdout_lines: tuple[queue.Queue[str | None], list[threading.Thread]],
) -> None:
    """SIGTERM to a running relay lets the pass in flight finish: it exits 0 within seconds,
    every message it printed is marked published, nothing else is, and no row is left claimed
    (the rest of its batch was handed back, not left to wait out the lease)."""
    messages = stage(engine, *({"n": n} for n in range(40)))
    lines, threads = stdout_lines
    stderr_path = tmp_path / "relay.stderr"
    command = cli_command(
        "relay",
        "--poll-interval",
        "0.05",
        "--batch-size",
        "5",
        "--publisher",
        f"{HELPERS}:slow_printer",
    )
    with (
        stderr_path.open("w") as stderr,
        subprocess.Popen(
            command,
            env=cli_env(url=url_of(engine)),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        ) as proc,
    ):
        assert proc.stdout is not None
        stream = proc.stdout

        def read() -> None:
            for line in stream:
                lines.put(line)
            lines.put(None)

        threads.append(threading.Thread(target=read, daemon=True))
        threads[0].start()
        first = lines.get(timeout=20)  # the relay is mid-pass once it has printed one message
        assert first is not None, stderr_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, stderr_path.read_text()
        threads[0].join(timeout=10)

    printed = [first]
    while (line := lines.get(timeout=5)) is not None:
        printed.append(line)
    printed_ids = {uuid.UUID(json.loads(line)["id"]) for line in printed}
    assert 1 <= len(printed_ids) < len(messages)
    assert published_ids(engine) == printed_ids
    assert all(row.claimed_by is None for row in all_rows(engine) if row.published_at is None)
    log = stderr_path.read_text()
    assert "Traceback" not in log
    assert "event=relay.stopping" in log
    assert "event=relay.stopped" in log


# --- in-process: the publisher spec loader and StdoutPublisher -----------------------------------


class _ObjectPublisher:
    def publish(self, message: outbox.OutboxMessage) -> None:
        pass


def _function_publisher(message: outbox.OutboxMessage) -> None:
    pass


class _NeedsArguments:
    def __init__(self, url: str) -> None:
        self.url = url

    def publish(self, message: outbox.OutboxMessage) -> None:
        pass


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable module ``fake_publishers`` holding one target of each kind."""
    module = types.ModuleType("fake_publishers")
    module.instance = _ObjectPublisher()  # type: ignore[attr-defined]
    module.PublisherClass = _ObjectPublisher  # type: ignore[attr-defined]
    module.function = _function_publisher  # type: ignore[attr-defined]
    module.NeedsArguments = _NeedsArguments  # type: ignore[attr-defined]
    module.number = 42  # type: ignore[attr-defined]
    module.nested = types.SimpleNamespace(publisher=_function_publisher)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_publishers", module)
    return module


def test_loader_resolves_each_accepted_form(fake_module: types.ModuleType) -> None:
    """`stdout` gives a StdoutPublisher; `module:attr` gives an object with publish as is, an
    instance of a class, a plain function as is, and follows dotted attribute paths."""
    assert isinstance(resolve_publisher("stdout"), StdoutPublisher)
    assert resolve_publisher("fake_publishers:instance") is fake_module.instance
    assert isinstance(resolve_publisher("fake_publishers:PublisherClass"), _ObjectPublisher)
    assert resolve_publisher("fake_publishers:function") is _function_publisher
    assert resolve_publisher("fake_publishers:nested.publisher") is _function_publisher
    assert resolve_publisher(" stdout ") is not None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("nosuchmodule:thing", "Cannot import module 'nosuchmodule'"),
        ("fake_publishers:missing", "has no attribute 'missing'"),
        ("fake_publishers:number", "neither an object with a publish(message) method"),
        ("fake_publishers:NeedsArguments", "could not be instantiated with no arguments"),
        ("fake_publishers", "'stdout' or 'module:attribute'"),
        ("", "'stdout' or 'module:attribute'"),
        ("fake publishers:thing", "dotted Python names"),
        ("amqp://guest:hunter2@rabbit:notaport/", "amqp"),
        ("celery:nosuchmodule_for_tests:app", "nosuchmodule_for_tests"),
        ("gopher://hole", "unknown scheme 'gopher'"),
    ],
)
def test_loader_errors_are_one_sentence_with_the_value(
    fake_module: types.ModuleType, spec: str, expected: str
) -> None:
    """Every bad spec raises PublisherError (never ImportError/AttributeError) quoting the spec
    and saying what to do; a password in a broker URL is hidden."""
    with pytest.raises(PublisherError) as caught:
        resolve_publisher(spec)

    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert "hunter2" not in message
    if spec and "hunter2" not in spec:
        assert repr(spec) in message or repr(spec.partition(":")[0]) in message


def _message(**input: Any) -> outbox.OutboxMessage:
    now = dt.datetime.now(dt.timezone.utc)
    return outbox.OutboxMessage(
        id=uuid.uuid4(),
        job="send_receipt",
        queue="default",
        input=input,
        idempotency_key="key-1",
        max_attempts=3,
        run_at=now,
        staged_at=now,
        tenant_id="acme",
    )


class _FlushCountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes: list[str] = []

    def flush(self) -> None:
        self.flushes.append(self.getvalue())
        super().flush()


def test_stdout_publisher_writes_one_flushed_json_line_per_message() -> None:
    """Each publish writes exactly one line of JSON with every message field and flushes it
    before returning, so a message reported published is never stuck in a buffer."""
    stream = _FlushCountingStream()
    publisher = StdoutPublisher(stream)
    first, second = _message(name="Zoë"), _message(n=2)

    publisher.publish(first)
    assert stream.flushes == [stream.getvalue()]
    publisher.publish(second)

    lines = stream.getvalue().splitlines()
    assert len(stream.flushes) == 2
    assert [json.loads(line)["id"] for line in lines] == [str(first.id), str(second.id)]
    assert json.loads(lines[0]) == first.to_dict()
    assert set(json.loads(lines[0])) == MESSAGE_KEYS
    assert "Zoë" in lines[0]
