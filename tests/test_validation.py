"""Validation: an ``enqueue`` call is refused at the call, or what it staged commits.

The table-driven tests run every kind of bad value on PostgreSQL and on SQLite (the ``engine``
fixture) and check that the business transaction around the refused call still commits. The
boundary tests commit the largest (or smallest) value each check lets through, and the evidence
tests show, with validation bypassed, that PostgreSQL itself refuses the value just past it.
"""

from __future__ import annotations

import copy
import datetime as dt
import enum
import sys
import types
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, String, Table, insert, select, text
from sqlalchemy.exc import DataError, DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sqla_outbox as outbox
from sqla_outbox import validation
from sqla_outbox.validation import (
    MAX_ATTEMPTS_LIMIT,
    MAX_INPUT_DEPTH,
    MAX_INT_DIGITS,
    MAX_TEXT_LENGTH,
    RUN_AT_RANGE,
    TRACEPARENT_LENGTH,
)

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UTC = dt.timezone.utc


class Base(DeclarativeBase):
    pass


class Note(Base):
    """The business row each test writes in the same transaction as its enqueues."""

    __tablename__ = "validation_notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str] = mapped_column(String(50))


@pytest.fixture
def db(engine: Engine) -> Engine:
    Base.metadata.create_all(engine)
    return engine


@pytest.fixture
def pg_db(pg_engine: Engine) -> Engine:
    Base.metadata.create_all(pg_engine)
    return pg_engine


def notes(engine: Engine) -> list[str]:
    with Session(engine) as session:
        return list(session.scalars(select(Note.text).order_by(Note.id)))


def rows(engine: Engine) -> list[outbox.OutboxRow]:
    with Session(engine) as session:
        stmt = select(outbox.OutboxRow).order_by(outbox.OutboxRow.staged_at, outbox.OutboxRow.id)
        return list(session.scalars(stmt))


class Handle:
    """A job handle: a ``.name`` and optional ``.queue`` and ``.max_attempts``."""

    def __init__(
        self, name: str = "bad_job", *, queue: object = None, max_attempts: object = None
    ) -> None:
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts

    def __repr__(self) -> str:
        return f"Handle({self.name!r})"


class Color(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 7


class Ratio(float):
    pass


class Plain(enum.Enum):
    A = 1


class Shouting(str):
    """A str equal to the plain str of the same text but hashing apart, so a dict holds both."""

    def __hash__(self) -> int:
        return ~str.__hash__(self)


class Frozen(Mapping[str, Any]):
    """A read-only Mapping that is not a dict."""

    def __init__(self, **items: Any) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def nested_lists(levels: int) -> list[Any]:
    """``levels`` lists, each the only item of the one around it."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def nested_dicts(levels: int) -> dict[str, Any]:
    """``levels`` dicts, each under the key 'a' of the one around it, the innermost {'n': 1}."""
    value: dict[str, Any] = {"n": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def self_containing() -> dict[str, Any]:
    value: dict[str, Any] = {"id": 1}
    value["self"] = value
    return value


def _text_field_cases() -> Iterator[Any]:
    for field in ("queue", "idempotency_key", "tenant_id", "enqueued_by"):
        yield pytest.param({field: "x" * 256}, ValueError, "255", id=f"{field}-256-chars")
        yield pytest.param({field: "a\x00b"}, ValueError, "NUL", id=f"{field}-nul")
        yield pytest.param({field: "caf\udce9"}, ValueError, "surrogate", id=f"{field}-surrogate")
        yield pytest.param({field: ""}, TypeError, "non-empty", id=f"{field}-empty")
        yield pytest.param({field: 5}, TypeError, f"{field} for job", id=f"{field}-not-str")


# (enqueue keyword arguments, the error class, a piece of the message). The job defaults to
# 'bad_job', and every message about anything but the job's name must name it.
BAD_CALLS = [
    # --- input: strings anywhere, keys included
    pytest.param({"input": {"note": "a\x00b"}}, ValueError, "at input['note']", id="input-nul"),
    pytest.param({"input": "\x00"}, ValueError, "NUL character", id="input-nul-top-level"),
    pytest.param(
        {"input": {"a": [{"k\x00": 1}]}},
        ValueError,
        "at input['a'][0] (key 'k\\x00')",
        id="input-nul-in-nested-key",
    ),
    pytest.param(
        {"input": {"items": [1, 2, "caf\udce9"]}},
        ValueError,
        "at input['items'][2]",
        id="input-lone-surrogate",
    ),
    pytest.param(
        {"input": ["\ud83d\ude00"]}, ValueError, "surrogate", id="input-surrogate-pair-code-points"
    ),
    pytest.param(
        {"input": {"\udcff": 1}}, ValueError, "(key '\\udcff')", id="input-surrogate-in-key"
    ),
    # --- input: numbers
    pytest.param(
        {"input": {"n": 10**MAX_INT_DIGITS}}, ValueError, "4300 digits", id="input-int-too-long"
    ),
    pytest.param(
        {"input": [-(10**MAX_INT_DIGITS)]}, ValueError, "at input[0]", id="input-neg-int-too-long"
    ),
    pytest.param({"input": {"x": float("nan")}}, TypeError, "nan at input['x']", id="input-nan"),
    pytest.param({"input": [float("-inf")]}, TypeError, "-inf at input[0]", id="input-infinity"),
    pytest.param(
        {"input": [Ratio("inf")]}, TypeError, "at input[0]", id="input-float-subclass-inf"
    ),
    # --- input: types and keys JSON has no place for
    pytest.param({"input": {1: "a"}}, TypeError, "(key 1)", id="input-int-key"),
    pytest.param({"input": {None: "a"}}, TypeError, "(key None)", id="input-none-key"),
    pytest.param(
        {"input": {"total": Decimal("1.10")}},
        TypeError,
        "Decimal('1.10') at input['total']",
        id="input-decimal",
    ),
    pytest.param({"input": {"tags": {"a"}}}, TypeError, "at input['tags']", id="input-set"),
    pytest.param({"input": b"bytes"}, TypeError, "b'bytes' at input.", id="input-bytes"),
    pytest.param({"input": [Plain.A]}, TypeError, "Plain.A", id="input-non-str-non-int-enum"),
    pytest.param(
        {"input": types.MappingProxyType({"when": dt.date(2030, 1, 1)})},
        TypeError,
        "at input['when']",
        id="input-date-inside-mappingproxy",
    ),
    pytest.param(
        {"input": {Shouting("a"): 1, "a": 2}}, ValueError, "same string", id="input-colliding-keys"
    ),
    # --- input: nesting
    pytest.param(
        {"input": nested_lists(MAX_INPUT_DEPTH + 1)},
        ValueError,
        "more than 64 deep",
        id="input-65-lists",
    ),
    pytest.param(
        {"input": nested_dicts(MAX_INPUT_DEPTH + 1)},
        ValueError,
        "a dict at level 65",
        id="input-65-dicts",
    ),
    pytest.param(
        {"input": {"wrapper": self_containing()}},
        ValueError,
        "contains itself",
        id="input-self-containing",
    ),
    # --- the job's name
    pytest.param({"job": "j" * 256}, ValueError, "255", id="job-256-chars"),
    pytest.param({"job": "send\x00"}, ValueError, "NUL", id="job-nul"),
    pytest.param({"job": "send\udce9"}, ValueError, "surrogate", id="job-surrogate"),
    pytest.param({"job": "  "}, ValueError, "non-empty", id="job-blank"),
    pytest.param({"job": 42}, TypeError, "job name", id="job-not-a-name"),
    pytest.param({"job": Handle("h" * 256)}, ValueError, "255", id="handle-name-256-chars"),
    # --- a job handle's attributes, checked like the keyword arguments
    pytest.param({"job": Handle(queue="")}, TypeError, ".queue", id="handle-queue-empty"),
    pytest.param({"job": Handle(queue=5)}, TypeError, ".queue", id="handle-queue-not-str"),
    pytest.param({"job": Handle(queue="q\x00")}, ValueError, ".queue", id="handle-queue-nul"),
    pytest.param({"job": Handle(queue="q" * 256)}, ValueError, "255", id="handle-queue-256-chars"),
    pytest.param(
        {"job": Handle(queue=""), "queue": "fine"},
        TypeError,
        ".queue",
        id="handle-queue-bad-though-overridden",
    ),
    pytest.param(
        {"job": Handle(max_attempts=True)}, TypeError, ".max_attempts", id="handle-attempts-bool"
    ),
    pytest.param(
        {"job": Handle(max_attempts=3.0)}, TypeError, ".max_attempts", id="handle-attempts-float"
    ),
    pytest.param(
        {"job": Handle(max_attempts=0)}, ValueError, ".max_attempts", id="handle-attempts-zero"
    ),
    pytest.param(
        {"job": Handle(max_attempts=2**31)},
        ValueError,
        "2147483647",
        id="handle-attempts-beyond-int4",
    ),
    # --- text columns
    *_text_field_cases(),
    # --- max_attempts
    pytest.param({"max_attempts": 2**31}, ValueError, "2147483647", id="attempts-beyond-int4"),
    pytest.param({"max_attempts": 0}, ValueError, "at least 1", id="attempts-zero"),
    pytest.param({"max_attempts": -1}, ValueError, "at least 1", id="attempts-negative"),
    pytest.param({"max_attempts": True}, TypeError, "max_attempts", id="attempts-bool"),
    pytest.param({"max_attempts": "3"}, TypeError, "max_attempts", id="attempts-str"),
    # --- traceparent, strictly W3C
    pytest.param({"traceparent": TRACE.upper()}, ValueError, "lowercase", id="trace-uppercase"),
    pytest.param({"traceparent": TRACE + "\n"}, ValueError, "56 characters", id="trace-newline"),
    pytest.param(
        {"traceparent": "ff" + TRACE[2:]}, ValueError, "version ff", id="trace-version-ff"
    ),
    pytest.param(
        {"traceparent": f"00-{'0' * 32}{TRACE[35:]}"},
        ValueError,
        "trace-id is all zeros",
        id="trace-zero-trace-id",
    ),
    pytest.param(
        {"traceparent": f"{TRACE[:36]}{'0' * 16}-01"},
        ValueError,
        "parent-id is all zeros",
        id="trace-zero-parent-id",
    ),
    pytest.param(
        {"traceparent": "01" + TRACE[2:] + "-future"},
        ValueError,
        "62 characters, not 55",
        id="trace-longer-future-version",
    ),
    pytest.param({"traceparent": TRACE[:-1]}, ValueError, "54 characters", id="trace-short"),
    pytest.param(
        {"traceparent": TRACE.replace("-", "_")}, ValueError, "W3C", id="trace-separators"
    ),
    pytest.param(
        {"traceparent": TRACE[:-2] + "0g"}, ValueError, "lowercase hex", id="trace-not-hex"
    ),
    pytest.param({"traceparent": TRACE.encode()}, TypeError, "traceparent", id="trace-bytes"),
    # --- run_at
    pytest.param({"run_at": dt.datetime(2030, 1, 1)}, ValueError, "timezone-aware", id="run-naive"),
    pytest.param({"run_at": "tomorrow"}, TypeError, "timedelta", id="run-not-a-time"),
    pytest.param(
        {"run_at": dt.timedelta(days=10**8)}, ValueError, "now + ", id="run-timedelta-overflows"
    ),
    pytest.param(
        {"run_at": dt.datetime(1, 1, 1, tzinfo=UTC)}, ValueError, "0001-01-02", id="run-year-1"
    ),
    pytest.param(
        {"run_at": dt.datetime(9999, 12, 31, tzinfo=UTC)},
        ValueError,
        "9999-12-30",
        id="run-last-day",
    ),
    pytest.param(
        {"run_at": dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(-dt.timedelta(hours=5)))},
        ValueError,
        "run_at",
        id="run-beyond-9999-in-utc",
    ),
]


@pytest.mark.parametrize(("call", "error", "needle"), BAD_CALLS)
def test_bad_value_is_refused_at_the_call_and_the_transaction_still_commits(
    db: Engine, call: dict[str, Any], error: type[Exception], needle: str
) -> None:
    """A value the table or the database would refuse raises at ``enqueue`` with a message that
    names the job, the field or path and the value; the refused call stages nothing, and the
    business row and a good enqueue in the same session commit."""
    call = dict(call)
    job = call.pop("job", "bad_job")
    with Session(db) as session:
        session.add(Note(text="business row"))
        good = outbox.enqueue(session, "good_job", {"n": 1})
        with pytest.raises(error) as info:
            outbox.enqueue(session, job, **call)
        message = str(info.value)
        assert isinstance(info.value, outbox.OutboxError)
        assert needle in message
        if getattr(job, "name", job) == "bad_job":
            assert "'bad_job'" in message
        assert len(message) < 700, message
        assert outbox.staged(session) == (good,)
        session.commit()
    assert notes(db) == ["business row"]
    assert [row.id for row in rows(db)] == [good.id]


def test_refused_call_on_a_connection_inserts_nothing(db: Engine) -> None:
    """On a Core Connection, where ``enqueue`` inserts at once, a refused call writes nothing and
    the connection's transaction still commits."""
    with db.connect() as conn:
        conn.execute(insert(Note), {"text": "core row"})
        with pytest.raises(ValueError, match="NUL"):
            outbox.enqueue(conn, "bad_job", {"note": "a\x00b"})
        good = outbox.enqueue(conn, "good_job")
        conn.commit()
    assert notes(db) == ["core row"]
    assert [row.id for row in rows(db)] == [good.id]


def test_changing_the_input_after_enqueue_changes_nothing_committed_or_published(
    db: Engine,
) -> None:
    """The input is copied at the call: appending to, rewriting or breaking the caller's nested
    lists and dicts afterwards changes neither the message, nor the row, nor what is published."""
    payload: dict[str, Any] = {"items": [1, {"sku": "A1", "tags": ["x"]}], "meta": {"k": "v"}}
    expected = copy.deepcopy(payload)
    with Session(db) as session:
        message = outbox.enqueue(session, "snapshot", payload)
        payload["items"].append(3)
        payload["items"][1]["tags"].append("y")
        payload["items"][1]["sku"] = "changed"
        payload["meta"]["bad"] = object()  # would fail the commit if the dict were still shared
        payload["new"] = "key"
        session.commit()
    assert message.input == expected
    assert [row.input for row in rows(db)] == [expected]
    published: list[outbox.OutboxMessage] = []
    with outbox.Relay(db, published.append) as relay:
        assert relay.drain().published == 1
    assert [m.input for m in published] == [expected]


def _astral(n: int) -> str:
    return "\U0001f600" * n  # valid characters outside the BMP: 4 UTF-8 bytes each


def _future_trace() -> str:
    return "cc" + TRACE[2:]  # W3C: a later version parses as 00 does; 55 chars fits the column


# (enqueue keyword arguments, the input expected back; None: the message's own input).
GOOD_CALLS = [
    pytest.param({"job": "j" * MAX_TEXT_LENGTH}, None, id="job-255-chars"),
    pytest.param({"queue": "é" * MAX_TEXT_LENGTH}, None, id="queue-255-two-byte-chars"),
    pytest.param({"idempotency_key": "k" * MAX_TEXT_LENGTH}, None, id="key-255-chars"),
    pytest.param({"tenant_id": _astral(MAX_TEXT_LENGTH)}, None, id="tenant-255-astral-chars"),
    pytest.param({"enqueued_by": "b" * MAX_TEXT_LENGTH}, None, id="enqueued-by-255-chars"),
    pytest.param({"max_attempts": MAX_ATTEMPTS_LIMIT}, None, id="attempts-int4-max"),
    pytest.param({"max_attempts": 1}, None, id="attempts-1"),
    pytest.param({"max_attempts": Level.HIGH}, None, id="attempts-intenum"),
    pytest.param(
        {"job": Handle("handled", queue="q" * MAX_TEXT_LENGTH, max_attempts=MAX_ATTEMPTS_LIMIT)},
        None,
        id="handle-at-its-bounds",
    ),
    pytest.param({"traceparent": TRACE}, None, id="trace-version-00"),
    pytest.param({"traceparent": _future_trace()}, None, id="trace-later-version-55-chars"),
    pytest.param({"run_at": RUN_AT_RANGE[0]}, None, id="run-earliest"),
    pytest.param({"run_at": RUN_AT_RANGE[1]}, None, id="run-latest"),
    pytest.param(
        {"input": nested_lists(MAX_INPUT_DEPTH)}, nested_lists(MAX_INPUT_DEPTH), id="input-64-lists"
    ),
    pytest.param(
        {"input": nested_dicts(MAX_INPUT_DEPTH)}, nested_dicts(MAX_INPUT_DEPTH), id="input-64-dicts"
    ),
    pytest.param(
        {"input": [10**MAX_INT_DIGITS - 1, -(10**MAX_INT_DIGITS - 1)]},
        [10**MAX_INT_DIGITS - 1, -(10**MAX_INT_DIGITS - 1)],
        id="input-4300-digit-ints",
    ),
    pytest.param(
        {"input": types.MappingProxyType({"a": (1, 2)})}, {"a": [1, 2]}, id="input-mappingproxy"
    ),
    pytest.param(
        {"input": OrderedDict([("b", 1), ("a", 2)])}, {"b": 1, "a": 2}, id="input-ordereddict"
    ),
    pytest.param({"input": Frozen(x=Frozen(y=1))}, {"x": {"y": 1}}, id="input-custom-mapping"),
    pytest.param(
        {"input": {Color.RED: Color.RED, "level": Level.HIGH, "ratio": Ratio(0.5)}},
        {"red": "red", "level": 7, "ratio": 0.5},
        id="input-enums-and-subclasses",
    ),
    pytest.param(
        {"input": {"text": "café " + _astral(3), "escaped": "\\u0000", "k" * 1000: ""}},
        {"text": "café " + _astral(3), "escaped": "\\u0000", "k" * 1000: ""},
        id="input-non-ascii-and-literal-backslash-u0000",
    ),
    pytest.param(
        {"input": {"t": True, "f": False, "n": None, "e": [], "o": {}, "x": 1.5, "z": -0.5}},
        {"t": True, "f": False, "n": None, "e": [], "o": {}, "x": 1.5, "z": -0.5},
        id="input-every-scalar",
    ),
]


@pytest.mark.parametrize(("call", "expected_input"), GOOD_CALLS)
def test_value_at_each_boundary_commits_and_reads_back(
    db: Engine, call: dict[str, Any], expected_input: Any
) -> None:
    """The largest (or smallest) value each check lets through commits with the business row on
    PostgreSQL and SQLite and reads back as the message holds it: the bounds are the database's,
    not guesses. Inputs come back as plain JSON values (mappings as dicts, enums as values)."""
    call = dict(call)
    job = call.pop("job", "good_job")
    with Session(db) as session:
        session.add(Note(text="business row"))
        message = outbox.enqueue(session, job, **call)
        session.commit()
    if expected_input is not None:
        assert message.input == expected_input
    assert notes(db) == ["business row"]
    [row] = rows(db)
    stored = {
        field: getattr(row, field) for field in message._fields if field not in ("id", "input")
    }
    assert stored == {f: v for f, v in message._asdict().items() if f not in ("id", "input")}
    assert row.id == message.id
    assert row.input == message.input
    assert _plain_types(row.input) and _plain_types(message.input)


def _plain_types(value: Any) -> bool:
    if type(value) is dict:
        return all(type(k) is str and _plain_types(v) for k, v in value.items())
    if type(value) is list:
        return all(_plain_types(item) for item in value)
    return value is None or type(value) in (str, int, float, bool)


# --- evidence: past each bound, PostgreSQL itself refuses ----------------------------------------


def _direct_row(**changes: Any) -> dict[str, Any]:
    now = dt.datetime.now(UTC)
    row: dict[str, Any] = {
        "id": uuid.uuid4(),
        "job": "direct",
        "queue": "default",
        "input": None,
        "idempotency_key": str(uuid.uuid4()),
        "max_attempts": 3,
        "run_at": now,
        "staged_at": now,
    }
    row.update(changes)
    return row


OUTBOX: Table = outbox.OutboxRow.__table__  # type: ignore[assignment]


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"job": "j" * (MAX_TEXT_LENGTH + 1)}, id="job-256-chars"),
        pytest.param({"queue": "é" * (MAX_TEXT_LENGTH + 1)}, id="queue-256-chars"),
        pytest.param({"traceparent": TRACE + "\n"}, id="traceparent-56-chars"),
        pytest.param({"max_attempts": MAX_ATTEMPTS_LIMIT + 1}, id="max-attempts-2-31"),
        pytest.param({"tenant_id": "a\x00b"}, id="text-nul"),
        pytest.param({"tenant_id": "caf\udce9"}, id="text-surrogate"),
        pytest.param({"input": {"note": "a\x00b"}}, id="jsonb-nul"),
        pytest.param({"input": {"note": "caf\udce9"}}, id="jsonb-surrogate"),
    ],
)
def test_postgresql_refuses_the_value_just_past_each_bound(
    pg_engine: Engine, changes: dict[str, Any]
) -> None:
    """With validation bypassed (a Core INSERT), PostgreSQL refuses the value just past each
    bound, so without the check at the call this is a failed commit."""
    with pytest.raises((DataError, UnicodeEncodeError)), pg_engine.begin() as conn:
        conn.execute(insert(OUTBOX), _direct_row(**changes))
    with pg_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox")).scalar() == 0


def test_run_at_at_datetime_edges_breaks_readers_in_other_time_zones(pg_engine: Engine) -> None:
    """PostgreSQL stores 0001-01-01 UTC, but a session in New York cannot read it back as a
    datetime (it is year 0 there), which is why run_at keeps a day from datetime's edges; the
    bounds of RUN_AT_RANGE read back in the zones furthest either side of UTC."""
    edge = dt.datetime(1, 1, 1, tzinfo=UTC)
    with pg_engine.begin() as conn:
        conn.execute(insert(OUTBOX), _direct_row(job="edge", run_at=edge))
        conn.execute(insert(OUTBOX), _direct_row(job="first", run_at=RUN_AT_RANGE[0]))
        conn.execute(insert(OUTBOX), _direct_row(job="last", run_at=RUN_AT_RANGE[1]))
    read = "SELECT run_at FROM outbox WHERE job = :job"
    with pg_engine.connect() as conn:
        conn.execute(text("SET TIME ZONE 'America/New_York'"))
        with pytest.raises(DBAPIError, match="before year 1"):
            conn.execute(text(read), {"job": "edge"}).scalar()
        conn.rollback()
        for zone in ("Etc/GMT+12", "Pacific/Kiritimati"):  # UTC-12 and UTC+14
            conn.execute(text(f"SET TIME ZONE '{zone}'"))
            assert conn.execute(text(read), {"job": "first"}).scalar() == RUN_AT_RANGE[0]
            assert conn.execute(text(read), {"job": "last"}).scalar() == RUN_AT_RANGE[1]


def test_postgresql_parses_the_deepest_input_even_at_its_smallest_stack(pg_engine: Engine) -> None:
    """At PostgreSQL's smallest max_stack_depth (100kB), jsonb still parses input nested
    MAX_INPUT_DEPTH deep (it stops near 624 there, near 13,000 at the default 2MB), and refuses
    1,000 levels: the limit is safely below the database's for every setting."""

    def depth(levels: int) -> str:
        return '{"a":' * levels + "1" + "}" * levels

    with pg_engine.connect() as conn:
        try:
            conn.execute(text("SET LOCAL max_stack_depth = '100kB'"))
        except DBAPIError as exc:
            if isinstance(exc.orig, psycopg.errors.InsufficientPrivilege):
                pytest.skip("setting max_stack_depth needs a superuser")
            raise
        parse = text("SELECT jsonb_typeof(CAST(:doc AS jsonb))")
        assert conn.execute(parse, {"doc": depth(MAX_INPUT_DEPTH)}).scalar() == "object"
        with pytest.raises(DBAPIError, match="stack depth limit exceeded"):
            conn.execute(parse, {"doc": depth(1000)})


# --- the snapshot and the messages, without a database ------------------------------------------


def test_snapshot_holds_only_plain_json_values() -> None:
    """Any Mapping becomes a dict (key order kept), a tuple a list, and str, int and float
    subclasses (enums) the plain values json.dumps would write; the caller's objects are not
    reused anywhere in the copy."""
    inner = [1, 2]
    value = {
        "proxy": types.MappingProxyType({"b": 1, "a": 2}),
        "ordered": OrderedDict([("z", 1), ("y", 2)]),
        "custom": Frozen(k=(Color.RED, Level.HIGH)),
        Color.RED: Ratio(2.5),
        "inner": inner,
    }
    snapshot = validation.json_snapshot("job", value)
    assert snapshot == {
        "proxy": {"b": 1, "a": 2},
        "ordered": {"z": 1, "y": 2},
        "custom": {"k": ["red", 7]},
        "red": 2.5,
        "inner": [1, 2],
    }
    assert list(snapshot["proxy"]) == ["b", "a"] and list(snapshot["ordered"]) == ["z", "y"]
    assert _plain_types(snapshot)
    assert snapshot is not value and snapshot["inner"] is not inner


def test_plain_str_and_enum_job_names_and_fields() -> None:
    """A str-valued enum is accepted as the job name and as a text field, stored as its value."""

    class Jobs(str, enum.Enum):
        SEND = "send_receipt"

    # No database: every check runs before the session is touched.
    with Session() as session, pytest.raises(ValueError, match="'send_receipt'"):
        outbox.enqueue(session, Jobs.SEND, {"n": "\x00"})
    message = validation.build_message(
        Jobs.SEND,
        None,
        staged_at=dt.datetime.now(UTC),
        queue=Color.RED,
        run_at=None,
        idempotency_key=None,
        tenant_id=None,
        enqueued_by=None,
        traceparent=None,
        max_attempts=Level.HIGH,
    )
    assert (message.job, message.queue, message.max_attempts) == ("send_receipt", "red", 7)
    assert type(message.job) is str and type(message.queue) is str
    assert type(message.max_attempts) is int


@pytest.mark.parametrize(
    "call",
    [
        pytest.param({"queue": "q" * 1_000_000}, id="million-char-queue"),
        pytest.param({"job": "j" * 1_000_000}, id="million-char-job"),
        pytest.param({"max_attempts": 10**100_000}, id="hundred-thousand-digit-attempts"),
        pytest.param({"input": {"n": 10**100_000}}, id="hundred-thousand-digit-int"),
        pytest.param({"input": {"k" * 100_000: "\x00"}}, id="huge-key-in-path"),
        pytest.param({"input": ["\x00" + "v" * 1_000_000]}, id="million-char-value"),
        pytest.param({"input": self_containing()}, id="self-containing"),
        pytest.param({"input": [object()] * 1_000_000}, id="huge-list"),
    ],
)
def test_errors_stay_short_for_huge_values(call: dict[str, Any]) -> None:
    """Huge or self-containing values are shortened in the message (with their length), so an
    error stays one readable sentence or two."""
    call = dict(call)
    job = call.pop("job", "bad_job")
    with Session() as session, pytest.raises(outbox.OutboxError) as info:
        outbox.enqueue(session, job, **call)
    assert len(str(info.value)) < 700, str(info.value)


@pytest.mark.skipif(not hasattr(sys, "set_int_max_str_digits"), reason="Python without the limit")
def test_a_lower_int_digit_limit_in_this_process_applies() -> None:
    """If this process lowered its int/str digit limit, input integers are held to it, since
    the commit must encode them here."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(1000)
    try:
        assert validation.json_snapshot("job", [10**999]) == [10**999]
        with pytest.raises(ValueError, match="more than 1000 digits"):
            validation.json_snapshot("job", [10**1000])
    finally:
        sys.set_int_max_str_digits(before)


def test_check_json_refuses_as_enqueue_does() -> None:
    """check_json (kept for callers of the old API) raises exactly what enqueue raises."""
    with pytest.raises(TypeError, match=r"Decimal\('1'\) at input\['x'\]"):
        validation.check_json("job", {"x": Decimal("1")})
    validation.check_json("job", {"x": [1, "a", None]})


def test_limits_match_the_table() -> None:
    """The documented limits are the outbox table's column types."""
    assert OUTBOX.c.job.type.length == MAX_TEXT_LENGTH  # type: ignore[attr-defined]
    for name in ("queue", "idempotency_key", "tenant_id", "enqueued_by"):
        assert OUTBOX.c[name].type.length == MAX_TEXT_LENGTH  # type: ignore[attr-defined]
    assert OUTBOX.c.traceparent.type.length == TRACEPARENT_LENGTH  # type: ignore[attr-defined]
    assert len(TRACE) == TRACEPARENT_LENGTH
