"""Turn ``enqueue``'s arguments into an :class:`OutboxMessage`, or refuse them at the call.

The rule: an ``enqueue`` call is refused at the call, or what it staged commits. A value the
table or the database would refuse must never get as far as ``commit()``, where it would take
the application's own rows down with it and point at a line three functions away. So every check
runs here, before anything is staged, and a refused call leaves the session exactly as it was.

What is refused (``TypeError`` for a wrong type, ``ValueError`` for a value the table cannot
hold; both are also :class:`~sqla_outbox.errors.OutboxError`):

* **Text columns** (every ``str`` field of the message but ``traceparent``: ``job``, ``queue``,
  ``idempotency_key``, ``tenant_id``, ``enqueued_by``, ``ordering_key``): a ``str`` of 1 to
  :data:`MAX_TEXT_LENGTH` characters (the columns are ``VARCHAR(255)``, which PostgreSQL and
  MySQL count in characters; MySQL's table is ``utf8mb4``, so four-byte characters such as
  emoji are one character there too). ``job`` must also hold more than whitespace.
* **Every string**, in those columns and anywhere in ``input`` (keys and values): no NUL
  (``'\\x00'``), which PostgreSQL stores in neither ``text`` nor ``jsonb``; and no surrogate code
  point (U+D800 to U+DFFF), which is not Unicode text: UTF-8 cannot encode it, and ``jsonb``
  refuses it escaped. (A Python ``str`` holds code points, so even a "pair" of surrogates is two
  lone ones; ``jsonb`` would silently merge it into one different character.) SQLite would take
  both, but they are refused there too, so code tested on SQLite behaves as it will in production.
* ``max_attempts``: an ``int`` from 1 to :data:`MAX_ATTEMPTS_LIMIT`, the most a 32-bit
  ``INTEGER`` column holds.
* ``traceparent``: a W3C ``traceparent`` header, strictly: ``version-traceid-parentid-flags`` in
  lowercase hex, exactly :data:`TRACEPARENT_LENGTH` characters (the column's length; a future
  version's longer header does not fit it), version not ``ff``, neither id all zeros.
* ``run_at``: an aware ``datetime`` or a ``timedelta`` from now, within :data:`RUN_AT_RANGE`
  (``datetime``'s years 1 to 9999 less a day at each end). PostgreSQL stores any of them, but
  psycopg hands a ``timestamptz`` back in the session's time zone, and 0001-01-01 00:00 UTC is
  a year-0 instant in New York, which ``datetime`` cannot hold: the row would commit and then
  break every relay reading it.
* A job handle's ``.queue`` and ``.max_attempts`` are checked exactly as the keyword arguments,
  even when a keyword argument overrides them: a bad handle is a bug wherever it is used.
* ``input``: strict JSON. ``dict`` or any other ``Mapping`` with ``str`` keys, ``list`` or
  ``tuple``, ``str``, ``int``, finite ``float``, ``bool``, ``None``, nested at most
  :data:`MAX_INPUT_DEPTH` containers deep (:data:`MYSQL_MAX_INPUT_DEPTH` on MySQL and MariaDB),
  integers of at most :data:`MAX_INT_DIGITS` digits.
  Refused: other types (``Decimal``, ``datetime``, ``set``: convert them first), non-``str`` keys
  (``json.dumps`` would silently turn ``{1: ...}`` into ``{"1": ...}``), ``NaN`` and infinities
  (``jsonb`` refuses them), and two keys of one mapping that are the same string.

The input is **copied at the call**: the message holds a snapshot in plain ``dict``, ``list``,
``str``, ``int``, ``float``, ``bool`` and ``None``, so changing the caller's object after
``enqueue`` changes nothing that is committed or published. The copy is also what makes any
``Mapping`` (``MappingProxyType``, a custom one) and tuples serialisable, and it stores ``str``,
``int`` and ``float`` subclasses (``StrEnum``, ``IntEnum``) as their plain values, exactly as
``json.dumps`` writes them. One walk both checks and copies; measured, it costs less than the
check alone used to (0.8 against 1.7 µs for a small input, 95 against 138 µs for 1,000 keys)
and less than serialising to JSON and back, which would still need a walk for depth and keys.

Why these limits (measured on PostgreSQL 15):

* :data:`MAX_INPUT_DEPTH` = 64. PostgreSQL parses ``jsonb`` recursively up to its
  ``max_stack_depth``: 13,091 nested objects at the default 2 MB, 624 at the smallest setting
  (100 kB). Python's ``json`` stops first, a little under ``sys.getrecursionlimit()`` (1,000)
  minus the caller's own stack, and it runs both at commit (encoding) and in the relay
  (decoding). 64 is ten times below the smallest of these, and within the defaults of common
  consumers' JSON parsers (Ruby's 100, serde_json's 128). It also bounds a self-containing
  input, which is refused as too deep instead of failing at commit.
* :data:`MYSQL_MAX_INPUT_DEPTH` = 31 on MySQL and MariaDB (measured on MariaDB 10.11): a MariaDB
  ``JSON`` column is ``LONGTEXT`` checked by ``JSON_VALID``, which refuses 32 nested containers,
  so the commit would fail with "CONSTRAINT failed". ``enqueue`` reads the dialect from the
  session's bind for the outbox table, so the check still runs at the call.
* :data:`MAX_INT_DIGITS` = 4,300: CPython's default limit for converting an ``int`` to and from
  decimal text, which the relay (another process, most likely with the default) parses the
  stored ``jsonb`` with. ``jsonb`` itself takes 131,072 digits. If this process has lowered its
  own limit (``sys.set_int_max_str_digits``), the lower limit applies, as the commit must encode.
* :data:`MAX_ATTEMPTS_LIMIT` = 2**31 - 1, and the column lengths, are the table's (see
  :mod:`sqla_outbox.model`).

Not checked: the total size. PostgreSQL refuses a ``jsonb`` value of 256 MB or more at commit;
an outbox message should carry ids and small facts, not documents. Also worth knowing: ``jsonb``
stores numbers as ``numeric`` and prints them without an exponent, so a float such as ``1e16``
comes back to the relay as the equal ``int`` ``10000000000000000``. MySQL 8's binary ``JSON``
keeps a number as a 64-bit integer or a double, so there a larger integer comes back as a
nearby float (send such numbers as ``str``); MariaDB keeps the JSON text as written.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import reprlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError, OutboxError
from sqla_outbox.ids import new_message_id
from sqla_outbox.message import OutboxMessage
from sqla_outbox.tracing import current_traceparent

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_QUEUE",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_INPUT_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_TEXT_LENGTH",
    "MYSQL_MAX_INPUT_DEPTH",
    "RUN_AT_RANGE",
    "TRACEPARENT_LENGTH",
    "build_message",
    "check_json",
    "checked_text",
    "json_snapshot",
    "max_input_depth",
    "text_problem",
]

DEFAULT_QUEUE = "default"
"""The queue of a message whose job names none and whose call passes none."""

DEFAULT_MAX_ATTEMPTS = 3
"""Attempts a consumer should give a job before giving up, unless the job or call says otherwise."""

MAX_TEXT_LENGTH = 255
"""Characters in every ``str`` field but ``traceparent`` (``job``, ``queue``, ``idempotency_key``,
``tenant_id``, ``enqueued_by``, ``ordering_key``): their columns are ``VARCHAR(255)``."""

TRACEPARENT_LENGTH = 55
"""Characters in a ``traceparent`` (the column's length, and version 00's exact length)."""

MAX_ATTEMPTS_LIMIT = 2**31 - 1
"""The largest ``max_attempts``: the ``max_attempts`` column is a 32-bit ``INTEGER``."""

RUN_AT_RANGE = (
    dt.datetime(1, 1, 2, tzinfo=dt.timezone.utc),
    dt.datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=dt.timezone.utc),
)
"""The earliest and latest ``run_at``: ``datetime``'s range less a day at each end, so that any
UTC offset a session time zone has (under a day) still gives a ``datetime`` when read back."""

MAX_INPUT_DEPTH = 64
"""Containers (mappings and lists) ``input`` may nest, counting the outermost one."""

MYSQL_MAX_INPUT_DEPTH = 31
"""Containers ``input`` may nest on MySQL and MariaDB: MariaDB's ``JSON_VALID`` (the check on its
``JSON`` columns) refuses 32. MySQL's own limit is 100, but a ``mysql://`` URL does not say
which of the two servers answers, and an ``enqueue`` must be refused the same on either."""

MAX_INT_DIGITS = 4300
"""Decimal digits an ``int`` in ``input`` may have: CPython's default int/str conversion limit."""

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_NUL_OR_SURROGATE = re.compile("[\x00\ud800-\udfff]")
# Every setting of sys.set_int_max_str_digits allows 640 digits (its smallest non-zero value), so
# an int below this bound is stored and shown without a second look; only larger ones look further.
_SAFE_INT_BOUND = 10**640

_reprs = reprlib.Repr()
_reprs.maxstring = _reprs.maxother = 80
_reprs.maxlevel = 3
_reprs.maxdict = _reprs.maxlist = _reprs.maxtuple = 6


def _shown(value: object) -> str:
    """``repr(value)``, shortened so an error stays readable whatever the caller passed."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _SAFE_INT_BOUND:
        # repr() itself would raise here (the int/str digit limit), and nobody reads 5,000 digits.
        return f"<int of about {int(abs(value).bit_length() * math.log10(2)) + 1} digits>"
    if isinstance(value, str) and len(value) > _reprs.maxstring:
        return f"{value[:60]!r}... ({len(value)} characters)"
    return _reprs.repr(value)


def _job_label(job: str) -> str:
    return f"job {_shown(job)}"


# --- text ----------------------------------------------------------------------------------------


_NUL = "a NUL character ('\\x00')"
_NUL_FIX = (
    "The outbox refuses NUL on every database, so that a call accepted on one (SQLite in "
    "development) is not refused on another (PostgreSQL's text and jsonb cannot hold it); "
    "remove it (e.g. value.replace('\\x00', "
    "'')), or encode binary data first (e.g. base64)."
)
_SURROGATE_FIX = (
    "It is not Unicode text, so UTF-8 cannot encode it and jsonb refuses it; repair the text "
    "where it was decoded (e.g. bytes.decode('utf-8', 'replace'), not 'surrogateescape')."
)


def text_problem(value: str) -> tuple[str, str] | None:
    """What PostgreSQL would refuse in ``value`` (a NUL or a surrogate) and the fix, or ``None``."""
    if value.isascii():
        return (_NUL, _NUL_FIX) if "\x00" in value else None
    found = _NUL_OR_SURROGATE.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return _NUL, _NUL_FIX
    return f"a lone surrogate {found.group()!r} at index {found.start()}", _SURROGATE_FIX


def checked_text(subject: str, value: object, fix: str = "", *, optional: bool = True) -> str:
    """``value`` as a plain ``str`` that a ``VARCHAR(255)`` column (``subject`` names it) takes
    on every database, or raise naming it and ``fix``: the one check of every text field.
    ``optional``: the field may also be ``None`` (checked by the caller), as the message says."""
    wanted = "a non-empty str or None" if optional else "a non-empty str"
    if type(value) is not str:
        if not isinstance(value, str):
            raise ArgumentTypeError(f"{subject} must be {wanted}, got {_shown(value)}.{fix}")
        value = str.__str__(value)  # a StrEnum member or other subclass: its plain text
    if not value:
        raise ArgumentTypeError(f"{subject} must be {wanted}, got ''.{fix}")
    if len(value) > MAX_TEXT_LENGTH:
        raise ConfigurationError(
            f"{subject} is longer than the column's {MAX_TEXT_LENGTH} characters ({len(value)}): "
            f"{_shown(value)}. Shorten it (e.g. a hash of the long value).{fix}"
        )
    problem = text_problem(value)
    if problem is not None:
        raise ConfigurationError(f"{subject} contains {problem[0]}: {_shown(value)}. {problem[1]}")
    return value


def _optional_text(job: str, field: str, value: object, fix: str = "") -> str | None:
    return None if value is None else checked_text(f"{field} for {_job_label(job)}", value, fix)


# --- the job and its handle -------------------------------------------------------------------


_HANDLE_FIX = " Fix the job handle's attribute (None means the default)."


def _job_fields(job: object) -> tuple[str, str | None, int | None]:
    """The job's name, and the queue and max_attempts its handle gives (checked), if any."""
    handle: object = None
    if isinstance(job, str):
        name = job
    else:
        handle_name = getattr(job, "name", None)
        if not isinstance(handle_name, str):
            raise ArgumentTypeError(
                f"job must be a job name (str) or a job handle with a .name, got {_shown(job)}. "
                "Pass e.g. outbox.enqueue(session, 'send_receipt', {...})."
            )
        name, handle = handle_name, job
    if not name.strip():
        raise ConfigurationError(
            f"job name must be a non-empty string, got {_shown(name)}. "
            "Pass the name consumers route on, e.g. 'send_receipt'."
        )
    name = checked_text("job name", name)
    if handle is None:
        return name, None, None
    queue = _optional_text(
        name, "the job handle's .queue", getattr(handle, "queue", None), _HANDLE_FIX
    )
    attempts = _max_attempts(
        name, "the job handle's .max_attempts", getattr(handle, "max_attempts", None), _HANDLE_FIX
    )
    return name, queue, attempts


def _max_attempts(job: str, field: str, value: object, fix: str = "") -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArgumentTypeError(
            f"{field} for {_job_label(job)} must be an int, got {_shown(value)}."
            f"{fix or ' Pass e.g. max_attempts=5.'}"
        )
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ConfigurationError(
            f"{field} for {_job_label(job)} must be at least 1 and at most "
            f"{MAX_ATTEMPTS_LIMIT} (the column is a 32-bit INTEGER), got {_shown(value)}.{fix}"
        )
    return int.__int__(value)  # an IntEnum member: its plain value


# --- run_at and traceparent ----------------------------------------------------------------------


def _run_at(job: str, value: object, now: dt.datetime) -> dt.datetime:
    if value is None:
        return now
    if isinstance(value, dt.timedelta):
        try:
            when = now + value
        except OverflowError:
            when = None
        shown = f"now + {_shown(value)}"
    elif isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigurationError(
                f"run_at for {_job_label(job)} must be timezone-aware, got naive {value!r}. "
                "Use e.g. datetime.now(timezone.utc) + timedelta(minutes=5), or pass a timedelta."
            )
        try:
            when = value.astimezone(dt.timezone.utc)
        except OverflowError:
            when = None
        shown = repr(value)
    else:
        raise ArgumentTypeError(
            f"run_at for {_job_label(job)} must be an aware datetime or a timedelta, "
            f"got {_shown(value)}. Pass e.g. run_at=timedelta(minutes=5)."
        )
    if when is None or not RUN_AT_RANGE[0] <= when <= RUN_AT_RANGE[1]:
        raise ConfigurationError(
            f"run_at for {_job_label(job)} is {shown}, not between {RUN_AT_RANGE[0]} and "
            f"{RUN_AT_RANGE[1]}: a reader whose session has another time zone could not turn it "
            "into a datetime. Pass an instant inside that range."
        )
    return when


def _traceparent_problem(value: str) -> str | None:
    if len(value) != TRACEPARENT_LENGTH:
        return f"it has {len(value)} characters, not {TRACEPARENT_LENGTH}"
    if not _TRACEPARENT.fullmatch(value):
        return "it is not four dash-separated fields of lowercase hex digits (2-32-16-2)"
    if value.startswith("ff"):
        return "version ff is forbidden"
    if value[3:35] == "0" * 32:
        return "its trace-id is all zeros"
    if value[36:52] == "0" * 16:
        return "its parent-id is all zeros"
    return None


def _traceparent(job: str, value: object) -> str | None:
    if value is None:
        return current_traceparent()
    if not isinstance(value, str):
        raise ArgumentTypeError(
            f"traceparent for {_job_label(job)} must be a str or None, got {_shown(value)}."
        )
    value = str.__str__(value)
    problem = _traceparent_problem(value)
    if problem is not None:
        raise ConfigurationError(
            f"traceparent for {_job_label(job)} must be a W3C traceparent header like "
            f"'00-<32 hex>-<16 hex>-<2 hex>' in lowercase, got {_shown(value)}: {problem}. "
            "Pass a valid header, or omit it to use the current OpenTelemetry span's."
        )
    return value


# --- input ----------------------------------------------------------------------------------------


class _InputError(Exception):
    """Raised inside the input walk; each container on the way out adds its step to ``steps``."""

    def __init__(self, error: type[OutboxError], problem: str, fix: str) -> None:
        super().__init__(problem)
        self.error = error
        self.problem = problem
        self.fix = fix
        self.steps: list[str] = []  # innermost first
        self.too_deep: str | None = None  # the type of the container one level too deep


_CONVERT_FIX = "Convert it first (e.g. str() for Decimal, UUID and datetime; a list for a set)."


def _int_digits_limit() -> int:
    # The relay, most likely another process with CPython's default, must parse what is stored;
    # this process must encode it at commit, under its own limit if it set a lower one.
    get_limit: Callable[[], int] | None = getattr(sys, "get_int_max_str_digits", None)
    own = get_limit() if get_limit is not None else 0
    return min(own, MAX_INT_DIGITS) if own else MAX_INT_DIGITS


def _plain_scalar(value: Any) -> Any:
    """``value`` (anything but a plain ``str``, ``dict`` or ``list``) as a plain JSON scalar."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        value = str.__str__(value)  # a StrEnum member: the text json.dumps writes
        problem = text_problem(value)
        if problem is not None:
            raise _InputError(
                ConfigurationError, f"has a string with {problem[0]}: {_shown(value)}", problem[1]
            )
        return value
    if isinstance(value, int):
        value = int.__int__(value)  # an IntEnum member: the number json.dumps writes
        if not -_SAFE_INT_BOUND < value < _SAFE_INT_BOUND:
            digits = _int_digits_limit()
            if not -(10**digits) < value < 10**digits:
                raise _InputError(
                    ConfigurationError,
                    f"has an integer of more than {digits} digits: {_shown(value)}",
                    "JSON readers refuse it (Python's int/str digit limit); send it as a str.",
                )
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _InputError(
                ArgumentTypeError,
                f"is not JSON-serialisable: {_shown(value)}",
                "JSON has no NaN or Infinity; send None or a str instead.",
            )
        return float.__float__(value)
    raise _InputError(ArgumentTypeError, f"is not JSON-serialisable: {_shown(value)}", _CONVERT_FIX)


def _plain_key(key: Any) -> str:
    """``key`` as the plain ``str`` a JSON object stores, or raise."""
    if not isinstance(key, str):
        refusal = _InputError(
            ArgumentTypeError,
            "has a key that is not a str",
            "JSON object keys are strings, and json.dumps would silently store this one as a "
            "different value; convert it yourself (e.g. str(key)).",
        )
        refusal.steps.append(f" (key {_shown(key)})")
        raise refusal
    text = str.__str__(key)  # a StrEnum member: the text json.dumps writes
    problem = text_problem(text)
    if problem is not None:
        refusal = _InputError(ConfigurationError, f"has a key with {problem[0]}", problem[1])
        refusal.steps.append(f" (key {_shown(text)})")
        raise refusal
    return text


def _too_deep(value: object) -> _InputError:
    # The walk counts down the containers left (``room``); json_snapshot, which knows the limit,
    # writes the problem.
    refusal = _InputError(
        ConfigurationError, "", "Flatten it, or send the deep part as a JSON string."
    )
    refusal.too_deep = type(value).__name__
    return refusal


def _copy(value: Any, room: int) -> Any:  # noqa: PLR0911 - one return per kind, exact types first
    """A plain-JSON copy of ``value`` (inside which ``room`` more containers may open), or raise
    ``_InputError``.

    This is the hot path of every ``enqueue``: plain types are tested by exact type first, and
    the containers copy their plain scalar items inline, since a call per item would double the
    cost. Everything else (subclasses, other mappings, refusals) goes the slow way.
    """
    kind = type(value)
    if kind is dict:
        return _copy_mapping(value, room)
    if kind is list or kind is tuple:
        return _copy_sequence(value, room)
    if kind is str:
        if value.isascii() and "\x00" not in value:
            return value
    elif kind is int:
        if -_SAFE_INT_BOUND < value < _SAFE_INT_BOUND:
            return value
    elif isinstance(value, Mapping):
        return _copy_mapping(value, room)
    elif isinstance(value, (list, tuple)):
        return _copy_sequence(value, room)
    return _plain_scalar(value)


def _copy_mapping(value: Mapping[Any, Any], room: int) -> dict[str, Any]:
    if room <= 0:
        raise _too_deep(value)
    copied: dict[str, Any] = {}
    for key, item in value.items():
        if type(key) is not str or (
            "\x00" in key if key.isascii() else _NUL_OR_SURROGATE.search(key)
        ):
            key = _plain_key(key)  # noqa: PLW2901 - the key, as stored
        kind = type(item)
        if (
            (kind is str and item.isascii() and "\x00" not in item)
            or (kind is int and -_SAFE_INT_BOUND < item < _SAFE_INT_BOUND)
            or (kind is float and item - item == 0.0)  # finite: inf - inf and nan - nan are nan
            or item is None
        ):
            copied[key] = item
            continue
        try:
            copied[key] = _copy(item, room - 1)
        except _InputError as refusal:
            refusal.steps.append(f"[{_shown(key)}]")
            raise
    if len(copied) != len(value):
        raise _InputError(
            ConfigurationError,
            f"has two keys that are the same string once stored: {_shown(dict(value))}",
            "Keep one of them.",
        )
    return copied


def _copy_sequence(value: list[Any] | tuple[Any, ...], room: int) -> list[Any]:
    if room <= 0:
        raise _too_deep(value)
    copied: list[Any] = []
    append = copied.append
    for index, item in enumerate(value):
        kind = type(item)
        if (
            (kind is str and item.isascii() and "\x00" not in item)
            or (kind is int and -_SAFE_INT_BOUND < item < _SAFE_INT_BOUND)
            or (kind is float and item - item == 0.0)
            or item is None
        ):
            append(item)
            continue
        try:
            append(_copy(item, room - 1))
        except _InputError as refusal:
            refusal.steps.append(f"[{index}]")
            raise
    return copied


def _path(steps: list[str]) -> str:
    path = "input" + "".join(reversed(steps))
    # A path 64 containers deep is long; its start and its end are what locate the value.
    return path if len(path) <= 200 else f"{path[:100]}...{path[-100:]}"


def json_snapshot(job: str, value: Any, max_depth: int = MAX_INPUT_DEPTH) -> Any:
    """A plain-JSON copy of ``value``, or raise naming the job, the path and the fix.

    The copy holds only ``dict``, ``list``, ``str``, ``int``, ``float``, ``bool`` and ``None``
    (see the module documentation for what is refused and why), nested at most ``max_depth``
    containers deep (:func:`max_input_depth` gives a database's). ``TypeError`` for a value
    JSON has no type for, ``ValueError`` for one the database cannot store.
    """
    if value is None:  # the default: no input
        return None
    try:
        return _copy(value, max_depth)
    except _InputError as refusal:
        problem = refusal.problem
        if refusal.too_deep is not None:
            whose = ", the most MariaDB's JSON takes" if max_depth == MYSQL_MAX_INPUT_DEPTH else ""
            problem = (
                f"nests containers more than {max_depth} deep{whose} (or contains itself): "
                f"a {refusal.too_deep} at level {max_depth + 1}"
            )
        raise refusal.error(
            f"input for {_job_label(job)} {problem} at {_path(refusal.steps)}. {refusal.fix}"
        ) from None


def check_json(job: str, value: Any) -> None:
    """Raise as :func:`json_snapshot` would if ``value`` is not input the outbox can store."""
    json_snapshot(job, value)


def max_input_depth(dialect: str) -> int:
    """How deep ``input`` may nest on the database of SQLAlchemy dialect ``dialect``:
    :data:`MYSQL_MAX_INPUT_DEPTH` on MySQL and MariaDB, else :data:`MAX_INPUT_DEPTH`."""
    return MYSQL_MAX_INPUT_DEPTH if dialect in MYSQL_DIALECTS else MAX_INPUT_DEPTH


# --- the message ----------------------------------------------------------------------------------


def build_message(
    job: object,
    input: Any,
    *,
    staged_at: dt.datetime,
    queue: object,
    run_at: object,
    idempotency_key: object,
    tenant_id: object,
    enqueued_by: object,
    traceparent: object,
    max_attempts: object,
    ordering_key: object = None,
    max_depth: int = MAX_INPUT_DEPTH,
) -> OutboxMessage:
    """Validate one ``enqueue`` call and return the message it stages, ``input`` copied and
    nested at most ``max_depth`` containers deep (see :func:`max_input_depth`)."""
    name, job_queue, job_attempts = _job_fields(job)
    snapshot = json_snapshot(name, input, max_depth)
    queue_ = _optional_text(name, "queue", queue)
    key = _optional_text(name, "idempotency_key", idempotency_key)
    attempts = _max_attempts(name, "max_attempts", max_attempts)
    tenant = _optional_text(name, "tenant_id", tenant_id)
    by = _optional_text(name, "enqueued_by", enqueued_by)
    order_key = _optional_text(name, "ordering_key", ordering_key)
    trace = _traceparent(name, traceparent)
    now = dt.datetime.now(dt.timezone.utc)
    when = _run_at(name, run_at, now)
    message_id = new_message_id()
    return OutboxMessage(
        id=message_id,
        job=name,
        queue=queue_ or job_queue or DEFAULT_QUEUE,
        input=snapshot,
        idempotency_key=key or str(message_id),
        max_attempts=attempts or job_attempts or DEFAULT_MAX_ATTEMPTS,
        run_at=when,
        staged_at=staged_at,
        tenant_id=tenant,
        traceparent=trace,
        enqueued_by=by,
        ordering_key=order_key,
    )
