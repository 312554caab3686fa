"""Dead letters, on PostgreSQL and SQLite: how a message becomes one, what it holds back, and
what an operator does with it, through the library (``outbox.dead_letters``, ``retry_dead``,
``discard_dead``) and the console script (``sqla-outbox dead list|retry|discard``, ``status``).

Every dead letter here is made the way production makes one: a relay with
``max_publish_attempts=2`` whose publisher refuses one message. Backoffs are expired by moving
``retry_at`` into the past between ticks, so no test sleeps.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from support import MakeRelay, expire_backoffs, row, run_cli, stage_inputs, url_of

import sqla_outbox as outbox
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError, MissingTableError
from sqla_outbox.message import OutboxMessage

KEY = "order-7"


class Refusing:
    """A publisher that refuses every message whose input has ``"fail": true`` while
    ``refuse`` is set; records, in order, what it published and what it refused."""

    def __init__(self) -> None:
        self.refuse = True
        self.published: list[uuid.UUID] = []
        self.refused: list[OutboxMessage] = []

    def __call__(self, message: OutboxMessage) -> None:
        if self.refuse and isinstance(message.input, dict) and message.input.get("fail"):
            self.refused.append(message)
            raise RuntimeError(f"broker refused {message.id}\nsecond line of the error")
        self.published.append(message.id)


@dataclass
class DeadSetup:
    """One dead letter (``bad``, key ``order-7``), the later message of its key it holds back
    (``later``), a message of its own (``other``, already published), and the relay."""

    engine: Engine
    relay: outbox.Relay
    publisher: Refusing
    bad: OutboxMessage
    later: OutboxMessage
    other: OutboxMessage

    def drain(self) -> int:
        """Tick until a tick publishes nothing; how many were published."""
        total = 0
        while published := self.relay.tick():
            total += published
        return total


def stage_one(engine: Engine, input: dict[str, object], **options: object) -> OutboxMessage:
    [message] = stage_inputs(engine, "send_receipt", [input], **options)
    return message


@pytest.fixture
def dead(engine: Engine, make_relay: MakeRelay) -> Iterator[DeadSetup]:
    """A dead letter made by two refused publishes (max_publish_attempts=2)."""
    bad = stage_one(engine, {"fail": True}, ordering_key=KEY)
    later = stage_one(engine, {"n": 2}, ordering_key=KEY)
    other = stage_one(engine, {"n": 3})
    publisher = Refusing()
    relay = make_relay(engine, publisher, max_publish_attempts=2, relay_id="relay-dead")

    assert relay.tick() == 1  # `other` flows past the failure; `later` is held back
    assert row(engine, bad).attempts == 1
    assert row(engine, bad).dead_at is None
    expire_backoffs(engine)
    assert relay.tick() == 0  # the second refusal: a dead letter
    assert row(engine, bad).dead_at is not None

    yield DeadSetup(engine, relay, publisher, bad, later, other)


# --- becoming a dead letter, and what it holds back ---------------------------------------------


def test_dead_letters_lists_the_message_with_its_attempts_and_error(dead: DeadSetup) -> None:
    """After max_publish_attempts refusals dead_letters() lists the message, exactly as the
    publisher received it (aware UTC timestamps), with attempts 2, the last error as the relay
    recorded it and an aware UTC dead_at; the record is frozen and has .id/.job/.queue/
    .ordering_key; a URL works as the bind as well as an Engine."""
    [letter] = outbox.dead_letters(dead.engine)

    assert isinstance(letter, outbox.DeadLetter)
    assert letter.message == dead.publisher.refused[-1]
    assert letter.message.input == {"fail": True}
    assert letter.id == dead.bad.id
    assert (letter.job, letter.queue, letter.ordering_key) == ("send_receipt", "default", KEY)
    assert letter.attempts == 2
    assert letter.last_error is not None
    assert letter.last_error.startswith(f"RuntimeError: broker refused {dead.bad.id}")
    assert letter.dead_at.tzinfo is dt.timezone.utc
    assert letter.message.staged_at.tzinfo is dt.timezone.utc
    assert letter.message.run_at.tzinfo is dt.timezone.utc
    assert abs(letter.dead_at - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(minutes=5)
    with pytest.raises(FrozenInstanceError):
        letter.attempts = 0  # type: ignore[misc]
    assert outbox.dead_letters(url_of(dead.engine)) == [letter]
    assert letter.to_dict()["dead_at"] == letter.dead_at.isoformat()


def test_a_dead_letter_holds_back_its_key_until_discarded(dead: DeadSetup) -> None:
    """While the message is dead, the later message of its ordering key is not published
    however often relays run (it is parked); no relay claims the dead letter. discard_dead()
    deletes it, never published, and the later message is published by the next pass."""
    expire_backoffs(dead.engine)
    assert dead.drain() == 0
    assert row(dead.engine, dead.later).published_at is None
    assert row(dead.engine, dead.later).parked is True
    assert dead.publisher.published == [dead.other.id]
    assert len(dead.publisher.refused) == 2

    assert outbox.discard_dead(dead.engine) == 1

    assert outbox.dead_letters(dead.engine) == []
    with dead.engine.connect() as conn:
        ids = set(conn.scalars(select(outbox.OutboxRow.id)))
    assert dead.bad.id not in ids
    assert row(dead.engine, dead.later).parked is False
    assert dead.drain() == 1
    assert dead.publisher.published == [dead.other.id, dead.later.id]
    assert len(dead.publisher.refused) == 2


def test_a_retried_dead_letter_is_published_first_with_attempts_reset(dead: DeadSetup) -> None:
    """retry_dead() (ids as text) makes the dead letter claimable now with attempts 0: refused
    once more it is charged one attempt and backs off, not dead (max_publish_attempts=2 counts
    afresh); once the publisher accepts it, it is published before the later message of its
    key, which follows."""
    assert outbox.retry_dead(dead.engine, [str(dead.bad.id)]) == 1

    retried = row(dead.engine, dead.bad)
    assert (retried.attempts, retried.dead_at, retried.retry_at) == (0, None, None)
    assert outbox.dead_letters(dead.engine) == []
    assert dead.relay.tick() == 0  # refused again: attempts 1 of 2, backing off
    assert row(dead.engine, dead.bad).attempts == 1
    assert row(dead.engine, dead.bad).dead_at is None
    assert row(dead.engine, dead.later).published_at is None

    dead.publisher.refuse = False
    expire_backoffs(dead.engine)
    assert dead.drain() == 2

    assert dead.publisher.published == [dead.other.id, dead.bad.id, dead.later.id]
    assert row(dead.engine, dead.bad).published_at is not None
    assert row(dead.engine, dead.later).published_at is not None


def test_only_dead_letters_are_retried_or_discarded(dead: DeadSetup) -> None:
    """Ids that are not dead letters are skipped, counted out: a published message, a held-back
    live one (never deleted by discard_dead), an unknown id; duplicates count once; an empty
    list does nothing."""
    unknown = uuid.uuid4()

    assert outbox.retry_dead(dead.engine, [dead.other.id, dead.later.id, unknown]) == 0
    assert outbox.discard_dead(dead.engine, [dead.other.id, dead.later.id, unknown]) == 0
    assert outbox.discard_dead(dead.engine, []) == 0
    assert row(dead.engine, dead.later).published_at is None
    assert row(dead.engine, dead.other).published_at is not None
    assert outbox.retry_dead(dead.engine, (dead.bad.id, str(dead.bad.id).upper())) == 1
    assert outbox.retry_dead(dead.engine) == 0


@pytest.mark.parametrize(
    ("ids", "error", "expected"),
    [
        (["not-a-uuid"], ConfigurationError, "'not-a-uuid' is not a message id"),
        ([42], ArgumentTypeError, "42 is not a message id"),
        ("0190b1f4-7c1e-7a3b-9d2e-5f6a7b8c9d0e", ArgumentTypeError, "got the single id"),
        (7, ArgumentTypeError, "ids must be a list (or other iterable)"),
    ],
)
@pytest.mark.parametrize("operation", [outbox.retry_dead, outbox.discard_dead])
def test_bad_ids_are_refused_in_one_sentence_before_anything_runs(
    dead: DeadSetup, operation: object, ids: object, error: type[Exception], expected: str
) -> None:
    """A malformed id, an id that is not a UUID or text, a bare string where a list belongs, or
    a non-iterable: one sentence naming the bad value and the fix, raised before anything is
    changed (the dead letter is still there)."""
    with pytest.raises(error) as caught:
        operation(dead.engine, ids)  # type: ignore[operator]

    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert message.endswith(".")
    assert isinstance(caught.value, outbox.OutboxError)
    assert [letter.id for letter in outbox.dead_letters(dead.engine)] == [dead.bad.id]


def test_dead_letters_without_the_table_names_the_fix(tmp_path: Path) -> None:
    """Against a database without the outbox table, dead_letters() raises MissingTableError
    naming the migration, not a driver error."""
    with pytest.raises(MissingTableError, match="alembic upgrade head"):
        outbox.dead_letters(f"sqlite:///{tmp_path / 'empty.sqlite3'}")


# --- the command line --------------------------------------------------------------------------


def test_dead_list_prints_each_dead_letter(dead: DeadSetup) -> None:
    """`dead list --json` prints one JSON object per dead letter: the message's fields plus
    attempts, last_error (whole) and dead_at; the table shows the id, job, queue, key, attempts
    and the first line of the error."""
    as_json = run_cli("dead", "list", "--json", url=url_of(dead.engine))
    table = run_cli("dead", "list", url=url_of(dead.engine))

    assert as_json.returncode == 0, as_json.stderr
    [line] = as_json.stdout.splitlines()
    letter = json.loads(line)
    assert letter["id"] == str(dead.bad.id)
    assert (letter["job"], letter["queue"], letter["ordering_key"]) == (
        "send_receipt",
        "default",
        KEY,
    )
    assert letter["input"] == {"fail": True}
    assert letter["attempts"] == 2
    assert letter["last_error"].endswith("\nsecond line of the error")
    assert dt.datetime.fromisoformat(letter["dead_at"]).utcoffset() == dt.timedelta(0)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("1 dead letter:\n")
    assert re.search(
        rf"^\s+{dead.bad.id}\s+send_receipt\s+default\s+{KEY}\s+2\s+\S+ \S+Z\s+"
        rf"RuntimeError: broker refused",
        table.stdout,
        re.MULTILINE,
    )
    assert "second line" not in table.stdout


def test_dead_list_with_no_dead_letters(sqlite_engine: Engine) -> None:
    """With no dead letters the table says so and --json prints nothing; both exit 0."""
    table = run_cli("dead", "list", url=url_of(sqlite_engine))
    as_json = run_cli("dead", "list", "--json", url=url_of(sqlite_engine))

    assert (table.returncode, table.stdout) == (0, "No dead letters.\n")
    assert (as_json.returncode, as_json.stdout) == (0, "")


@pytest.mark.parametrize("by", ["id", "all"])
@pytest.mark.parametrize("action", ["retry", "discard"])
def test_dead_retry_and_discard_through_the_cli(dead: DeadSetup, action: str, by: str) -> None:
    """`dead retry|discard ID` and `--all` exit 0 and say how many they settled. A retried
    dead letter is published again first, then what it held back; a discarded one is deleted,
    never published, and what it held back is published."""
    selector = [str(dead.bad.id)] if by == "id" else ["--all"]

    result = run_cli("dead", action, *selector, url=url_of(dead.engine))

    assert result.returncode == 0, result.stderr
    verb = "Retried" if action == "retry" else "Discarded"
    assert result.stdout.startswith(f"{verb} 1 dead letter;")
    assert outbox.dead_letters(dead.engine) == []
    dead.publisher.refuse = False
    dead.drain()
    if action == "retry":
        assert dead.publisher.published == [dead.other.id, dead.bad.id, dead.later.id]
    else:
        assert dead.publisher.published == [dead.other.id, dead.later.id]


def test_dead_retry_of_an_id_that_is_not_dead_exits_1_naming_it(dead: DeadSetup) -> None:
    """Given a dead letter and an id that is not one, `dead retry` retries the dead letter, says
    so, and exits 1 with one sentence naming the other id."""
    result = run_cli("dead", "retry", str(dead.bad.id), str(dead.later.id), url=url_of(dead.engine))

    assert result.returncode == 1
    assert result.stdout.startswith("Retried 1 dead letter;")
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        f"Error: 1 id given is not a dead letter (published, retried or discarded already, or "
        f"never staged): {dead.later.id}. `sqla-outbox dead list` shows the dead letters."
    ]
    assert "Traceback" not in result.stderr
    assert row(dead.engine, dead.bad).dead_at is None


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["retry", "not-a-uuid"], "Error: 'not-a-uuid' is not a message id"),
        (["discard"], "Error: Pass the ids of the dead letters to discard"),
        (["retry", "--all", "0190b1f4-7c1e-7a3b-9d2e-5f6a7b8c9d0e"], "not both"),
    ],
)
def test_dead_usage_errors_are_one_sentence(
    dead: DeadSetup, args: list[str], expected: str
) -> None:
    """A malformed id, neither ids nor --all, or both: exit 2 with one `Error:` sentence, no
    traceback, nothing changed."""
    result = run_cli("dead", *args, url=url_of(dead.engine))

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert expected in line
    assert [letter.id for letter in outbox.dead_letters(dead.engine)] == [dead.bad.id]


@pytest.mark.parametrize("command", [["list"], ["retry", "--all"], ["discard", "--all"]])
def test_dead_commands_without_the_table_name_the_fix(tmp_path: Path, command: list[str]) -> None:
    """Against a database without the outbox table, every `dead` command exits 1 with one
    sentence naming the migration, no traceback."""
    path = tmp_path / "app.sqlite3"
    engine = outbox.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    engine.dispose()

    result = run_cli("dead", *command, url=f"sqlite:///{path}")

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "alembic upgrade head" in line


def test_status_counts_dead_letters_and_shows_what_they_hold(dead: DeadSetup) -> None:
    """`status --json` counts the dead letter and the row parked behind it, lists the dead
    letter under `holding` (state dead, dead_at, no retry_at, last error), and the table points
    the operator at `sqla-outbox dead list`."""
    expire_backoffs(dead.engine)
    dead.drain()  # a claim meets the held-back row and parks it

    result = run_cli("status", "--json", url=url_of(dead.engine))
    table = run_cli("status", url=url_of(dead.engine))

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["pending"], report["due"], report["failing"]) == (2, 0, 1)
    assert (report["dead"], report["parked"], report["backing_off"]) == (1, 1, 0)
    [holding] = report["holding"]
    assert holding["id"] == str(dead.bad.id)
    assert holding["state"] == "dead"
    assert holding["attempts"] == 2
    assert holding["retry_at"] is None
    assert holding["dead_at"] is not None
    assert holding["last_error"].startswith("RuntimeError: broker refused")
    assert table.returncode == 0, table.stderr
    assert re.search(r"dead letters\s+1$", table.stdout, re.MULTILINE)
    assert re.search(
        rf"^\s+{dead.bad.id}\s+send_receipt\s+{KEY}\s+2\s+dead letter\s+",
        table.stdout,
        re.MULTILINE,
    )
    assert "sqla-outbox dead list" in table.stdout
