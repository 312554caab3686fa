"""The two hot statements, compiled once and sent as driver SQL on PostgreSQL through psycopg.

A relay pass and the commit of an enqueuing transaction each run one or two statements, many
times a second. Through ``Connection.execute`` every one of them pays SQLAlchemy's per-statement
work: a cache key for the construct, a compiled-cache lookup, bind processing per value and
result set-up, a visible share of a small web transaction on the enqueue path. So on psycopg,
the statements are compiled from :mod:`sqla_outbox.queries` once per dialect and executed with
``Connection.exec_driver_sql`` and values psycopg adapts natively (``uuid.UUID``, aware
datetimes, ``Jsonb``). That keeps what matters of SQLAlchemy: the statement still goes through
the session's ``Connection`` and transaction, fires ``before_cursor_execute`` and
``after_cursor_execute`` (SQL logging and tracing instrumentation see it), and a driver error
still arrives as SQLAlchemy's exception, with disconnects detected.

The relay's statements (not the staging INSERT) go one step further: :func:`execute` sends them
with PostgreSQL's own ``$1`` placeholders through a psycopg ``RawCursor``. psycopg converts a
``%(name)s`` query to ``$1`` form on every execute and caches the conversion only for queries of
up to 4,096 characters, which the relay's claims exceed: each claim would pay for its conversion
again. Converted once here, they are sent as they are. With
``tolerant``, the cursor also decodes ``jsonb`` as the connection would, except that a value
Python cannot decode (a hand-written row nested deeper than the recursion limit) is that row's
:class:`~sqla_outbox.coltypes.UndecodableInput` instead of an error (see ``stores.psycopg``).

Every other dialect and driver, and any connection with a ``schema_translate_map``, executes the
Core statements as they are.
"""

from __future__ import annotations

import functools
import json
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import ARRAY, Connection, CursorResult, Dialect, Uuid
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

from sqla_outbox.coltypes import undecodable

if TYPE_CHECKING:
    import psycopg

__all__ = ["Precompiled", "applies", "execute", "precompile", "relay_cursor", "send_arrays_binary"]

_PLACEHOLDER = re.compile(r"%\((?P<name>[^)]+)\)(?P<format>[sb])|%%")
"""A pyformat placeholder as SQLAlchemy renders it for psycopg (``%(name)s``, or ``%(name)b``
for binary), or an escaped ``%``."""


class _BinaryArray(list[Any]):
    """A list psycopg sends in its binary array format even through a ``RawCursor`` (which has
    no ``%b``), once :func:`send_arrays_binary` registered the binary list dumper for this type
    on the connection."""


@dataclass(frozen=True, slots=True)
class Precompiled:
    """A statement's SQL text for one dialect and the literal parameters compiled into it.

    Parameters declared ``literal_execute`` (the claim's row counts) are written into the text
    itself, as SQLAlchemy writes them when it executes the construct: :meth:`text` renders the
    SQL for their values, once per distinct set of values.
    """

    sql: str
    constants: dict[str, Any]
    inline: tuple[str, ...] = ()
    numbered: str = ""
    """:attr:`sql` with ``$1`` placeholders, for :func:`execute`."""
    names: tuple[str, ...] = ()
    """The parameter behind each ``$n`` of :attr:`numbered`, in order."""
    binary: frozenset[str] = frozenset()
    """The parameters sent in psycopg's binary format (arrays of UUIDs)."""
    _texts: dict[tuple[bool, tuple[int, ...]], str] = field(
        default_factory=dict, compare=False, repr=False
    )

    def params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` completed with the statement's own constants (``LIMIT 1`` and the like)."""
        return {**self.constants, **params} if self.constants else params

    def values(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """``params`` (and the constants) in :attr:`numbered`'s order, for :func:`execute`."""
        every = {**self.constants, **params}
        binary = self.binary
        return tuple(
            _BinaryArray(every[name]) if name in binary else every[name] for name in self.names
        )

    def text(self, params: Mapping[str, Any], *, numbered: bool = False) -> str:
        """The SQL to send with ``params``: :attr:`sql` (or :attr:`numbered`) with the inline
        values written in.

        Inline values are row counts: anything but an ``int`` is refused rather than written
        into SQL.
        """
        template = self.numbered if numbered else self.sql
        if not self.inline:
            return template
        values = tuple(params[name] for name in self.inline)
        text = self._texts.get((numbered, values))
        if text is None:
            text = template
            for name, value in zip(self.inline, values, strict=True):
                if type(value) is not int:
                    raise TypeError(f"inline parameter {name!r} must be an int, not {value!r}")
                text = text.replace(f"__[POSTCOMPILE_{name}]", str(value))
            self._texts[numbered, values] = text
        return text


def applies(dialect: Dialect, execution_options: Mapping[str, Any]) -> bool:
    """True where statements run as pre-compiled driver SQL: PostgreSQL through psycopg.

    Not under a ``schema_translate_map``: SQLAlchemy applies it when it executes a construct,
    and a string compiled in advance would name the untranslated table.
    """
    return (
        dialect.name == "postgresql"
        and dialect.driver == "psycopg"
        and not execution_options.get("schema_translate_map")
    )


def precompile(
    statement: ClauseElement, dialect: Dialect, column_keys: tuple[str, ...] = ()
) -> Precompiled:
    """``statement`` compiled for ``dialect``; callers keep the result for as long as it serves.

    ``column_keys`` names the columns an INSERT's parameter rows carry, so the compiled VALUES
    list has exactly those.

    Arrays of UUIDs (a claim's ids, sent back with its mark) travel in psycopg's binary format:
    its text format quotes each element through a regular expression, several times slower
    than the binary format for the ids of a large claim.
    """
    compiled = statement.compile(dialect=dialect, column_keys=list(column_keys) or None)
    sql = str(compiled)
    if isinstance(compiled, SQLCompiler):
        literal = compiled.literal_execute_params
        for bind in compiled.binds.values():
            if isinstance(bind.type, ARRAY) and isinstance(bind.type.item_type, Uuid):
                sql = sql.replace(f"%({bind.key})s", f"%({bind.key})b")
    else:  # pragma: no cover - every statement here is a SQL construct
        literal = frozenset()
    inline = tuple(sorted({param.key for param in literal}))
    constants = {k: v for k, v in compiled.params.items() if k not in inline}
    numbered, names, binary = _numbered(sql)
    return Precompiled(sql, constants, inline, numbered, names, binary)


def _numbered(sql: str) -> tuple[str, tuple[str, ...], frozenset[str]]:
    """``sql`` with each named placeholder as ``$n`` (a name used twice keeps its number), the
    names in number order, and those asked for in binary (``%(name)b``): what psycopg would do
    on every execute, done once."""
    names: dict[str, int] = {}
    binary: set[str] = set()

    def number(match: re.Match[str]) -> str:
        name = match.group("name")
        if name is None:
            return "%"
        if match.group("format") == "b":
            binary.add(name)
        return f"${names.setdefault(name, len(names) + 1)}"

    return _PLACEHOLDER.sub(number, sql), tuple(names), frozenset(binary)


_binary_ready: weakref.WeakSet[Any] = weakref.WeakSet()
"""The psycopg connections :func:`send_arrays_binary` has taught."""


def send_arrays_binary(driver: psycopg.Connection[Any]) -> None:
    """Teach a psycopg connection to send :meth:`Precompiled.values`' UUID arrays in binary
    (once per connection): a ``RawCursor`` has no ``%b`` to ask for it."""
    from psycopg.types.array import ListBinaryDumper  # noqa: PLC0415 - psycopg's own dumper

    if driver not in _binary_ready:
        driver.adapters.register_dumper(_BinaryArray, ListBinaryDumper)
        _binary_ready.add(driver)


@functools.cache
def relay_cursor(*, tolerant: bool = False) -> type[psycopg.RawCursor[Any]]:
    """The ``RawCursor`` the relay's statements run on: ``jsonb`` decoded by the connection's
    own loader (a ``set_json_loads`` of the application's included), by :func:`_jsonb_loader`.

    The loader is replaced on the cursor's own copy of the connection's adapters, never on the
    connection: it goes back to the application's pool as it came.
    """
    from psycopg import RawCursor  # noqa: PLC0415 - psycopg is this function's driver
    from psycopg.pq import Format  # noqa: PLC0415

    class RelayCursor(RawCursor[Any]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            adapters = self.adapters
            jsonb = adapters.types["jsonb"].oid
            loader = adapters.get_loader(jsonb, Format.TEXT)
            if loader is not None:
                loads = getattr(loader, "_loads", None)  # psycopg's, or set_json_loads'
                replacement = _jsonb_loader(loader, loads, tolerant=tolerant)
                if replacement is not loader:
                    adapters.register_loader(jsonb, replacement)

    return RelayCursor


_DECODER = json.JSONDecoder()
"""What ``json.loads`` decodes a string with when given no options."""


@functools.cache
def _jsonb_loader(loader: type[Any], loads: Any, *, tolerant: bool) -> type[Any]:
    """``loader`` (the connection's ``jsonb`` loader class, decoding with ``loads``), read
    faster where that changes nothing, and with ``tolerant`` returning what it cannot decode as
    :class:`~sqla_outbox.coltypes.UndecodableInput`.

    psycopg's own loader hands ``json.loads`` the value's bytes, and ``json.loads`` spends more
    than half of a small object's decoding working out which Unicode encoding the bytes are
    in, once per claimed row. PostgreSQL
    sends ``jsonb`` as text in the connection's encoding, which ``json.loads`` can only have read
    as UTF-8 (JSON text starts with an ASCII character, so its detection never picks UTF-16 or
    32 here): the bytes are decoded as UTF-8 directly, exactly as it would have, and the string
    parsed by the decoder ``json.loads`` itself uses. Only when the loader decodes with
    ``json.loads``: a ``loads`` the application set is kept as it is (``loads`` is part of the
    cache's key because ``set_json_loads`` without a context changes it on the class itself).
    """
    from psycopg.types.json import JsonbLoader  # noqa: PLC0415 - psycopg's own loader

    fast = issubclass(loader, JsonbLoader) and loads is json.loads
    load: Callable[[Any, Any], Any] = _decode_utf8 if fast else loader.load
    if tolerant:
        load = _tolerating(load)
    if load is loader.load:
        return loader
    return type("RelayJsonbLoader", (loader,), {"load": load})


def _decode_utf8(_loader: Any, data: Any) -> Any:
    """A ``jsonb`` value as ``json.loads`` decodes its UTF-8 bytes (see :func:`_jsonb_loader`)."""
    return _DECODER.decode(str(data, "utf-8", "surrogatepass"))


def _tolerating(load: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``load``, returning a value it cannot decode as an
    :class:`~sqla_outbox.coltypes.UndecodableInput` instead of raising."""

    def tolerant_load(loader: Any, data: Any) -> Any:
        try:
            return load(loader, data)
        except (ValueError, RecursionError) as error:
            return undecodable(bytes(data).decode("utf-8", "replace"), error)

    return tolerant_load


def execute(
    connection: Connection,
    precompiled: Precompiled,
    params: Mapping[str, Any],
    *,
    tolerant: bool = False,
) -> CursorResult[Any]:
    """Run ``precompiled`` with ``params`` on ``connection`` as numbered SQL through a psycopg
    ``RawCursor`` (see the module docs), still by ``Connection.exec_driver_sql``: SQLAlchemy's
    cursor events, error translation and disconnect handling apply as before.

    The connection's cursor factory is switched for this one statement only: a connection is
    used by one thread at a time, and everything else sent on it keeps ``%(name)s`` SQL.
    The relay's cursor costs a little per statement over a plain ``RawCursor`` (its own copy
    of the connection's loaders) and saves more per ``jsonb`` value of a claim. ``tolerant``
    (see the module docs) costs a little more per value, so it is for the claims of a relay
    that met an undecodable one.
    """
    driver = cast("psycopg.Connection[Any]", connection.connection.driver_connection)
    send_arrays_binary(driver)
    factory = driver.cursor_factory
    driver.cursor_factory = relay_cursor(tolerant=tolerant)
    try:
        return connection.exec_driver_sql(
            precompiled.text(params, numbered=True), precompiled.values(params)
        )
    finally:
        driver.cursor_factory = factory
