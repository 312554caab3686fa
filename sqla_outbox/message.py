"""``OutboxMessage``: the immutable record ``enqueue`` returns and a publisher receives, and the
one definition of its fields that everything writing a message out derives from.

It is deliberately not the ORM row. A publisher must not be able to change what was committed,
and a message staged in a transaction that has not committed yet has no row to point at.

It is a ``typing.NamedTuple`` rather than a frozen dataclass because a relay builds one per
claimed row, and a named tuple is built from a row several times faster than a frozen
dataclass. Read it by attribute; the tuple order is the table's column order and is not part of
the API.

One definition of the fields
    The class body below is the list of a message's fields; nothing else writes that list out.
    :data:`FIELDS` derives from each field's annotated type how it is written outside Python (a
    UUID as its text, a ``datetime`` as ISO 8601 with offset, an ``int`` as a JSON number or as
    decimal text, ``input`` as JSON or as compact JSON text) and whether it may be ``None``.
    :meth:`OutboxMessage.to_dict` and every broker's headers are built from it: a publisher
    states only its naming rule, how it writes ``None``, and the fields it carries in a place of
    their own (:func:`wire_fields`). So a new field travels everywhere once it is declared here.
    What is genuinely its own is written elsewhere: its column (a new table version in
    :mod:`sqla_outbox.versions`), its check and default in
    :func:`sqla_outbox.validation.build_message`, its ``enqueue`` argument.
    ``tests/unit/test_fields.py`` fails until each of them is there.

The trap
    A default (``= None``) on a new field hides a forgotten argument: ``build_message`` builds
    the message by keyword, and a field it does not pass is ``None`` in every message staged,
    silently. The relay, for its part, builds messages by position from the claim's leading
    columns (``tuple.__new__``, no check), which is right because the claim selects exactly
    :data:`sqla_outbox.queries.MESSAGE_FIELDS`, derived from this class in field order.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Collection
from typing import Any, NamedTuple, get_args, get_type_hints

from sqla_outbox.errors import PublisherError

__all__ = [
    "FIELDS",
    "Field",
    "OutboxMessage",
    "Spell",
    "WireField",
    "compact_json",
    "spelled",
    "wire_fields",
    "wire_name",
]


_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def compact_json(value: Any) -> str:
    """``value`` as compact JSON text (no spaces, non-ASCII kept as is): what publishers send.

    One spelling for every broker, so a consumer reading two of them sees byte-identical input.
    The text is ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``, written by one
    encoder built once: ``json.dumps`` with options builds a new encoder on every call, about
    as costly as encoding a small input itself, once per message published.
    """
    return _COMPACT.encode(value)


class OutboxMessage(NamedTuple):
    """One job, as staged and as published.

    ``idempotency_key`` is what a consumer deduplicates on: the relay publishes at least once, so
    a message can arrive twice after a crash between publish and mark, always with the same key.
    ``traceparent`` is the W3C trace context of the span that enqueued it, so the job's own span
    can name the request that caused it as its parent. ``ordering_key`` groups messages that
    must be published in staging order across transactions (a relay lets every other message
    flow past one that is held back).
    """

    id: uuid.UUID
    job: str
    queue: str
    input: Any
    idempotency_key: str
    max_attempts: int
    run_at: dt.datetime
    staged_at: dt.datetime
    tenant_id: str | None = None
    traceparent: str | None = None
    enqueued_by: str | None = None
    ordering_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields in field order (ids and timestamps as strings, ``None`` kept), for
        publishers that serialise."""
        fields: dict[str, Any] = {}
        for (name, spell), value in zip(_JSON, self, strict=True):
            fields[name] = value if spell is None or value is None else spell(value)
        return fields


Spell = Callable[[Any], Any]
"""Turns a field's value into how it is written; ``None`` in a table means "the value as is",
which saves a call per field for the text fields that are already what is written."""


class Field(NamedTuple):
    """One field of :class:`OutboxMessage` and how it is written outside Python."""

    name: str
    position: int
    """Its index in the tuple: publishers read ``message[position]``, the fastest access."""
    optional: bool
    """It may be unset, ``None`` (annotated ``X | None``): each broker leaves it out or sends its
    null. A field that is not optional is always sent; ``input``'s ``None`` is JSON ``null``."""
    json: Spell | None
    """Its value in a JSON object (:meth:`OutboxMessage.to_dict`)."""
    text: Spell | None
    """Its value as a string, for a header or a stream field that holds only text."""


# How a value of each annotated type is written: (in JSON, as text). An int stays a JSON number
# but is decimal text in a header; input is already JSON-ready and is compact JSON as text.
# Keyed by type rather than by field: fields of one type are written alike, so a new field of a
# type listed here needs no entry, and one of another type fails at import, naming this table.
_SPELLINGS: dict[object, tuple[Spell | None, Spell | None]] = {
    str: (None, None),
    int: (None, str),
    uuid.UUID: (str, str),
    dt.datetime: (dt.datetime.isoformat, dt.datetime.isoformat),
    Any: (None, compact_json),
}


def _field(position: int, name: str, hint: object) -> Field:
    kinds = [kind for kind in get_args(hint) if kind is not type(None)] or [hint]
    if len(kinds) != 1 or kinds[0] not in _SPELLINGS:
        raise TypeError(
            f"OutboxMessage.{name} is annotated {hint!r}, which has no spelling; annotate it with "
            f"one of {', '.join(map(repr, _SPELLINGS))} (or X | None), or add its type to "
            "_SPELLINGS in sqla_outbox/message.py."
        )
    json_, text = _SPELLINGS[kinds[0]]
    return Field(name, position, kinds[0] is not hint, json_, text)


_HINTS = get_type_hints(OutboxMessage)
FIELDS: tuple[Field, ...] = tuple(
    _field(position, name, _HINTS[name]) for position, name in enumerate(OutboxMessage._fields)
)
"""Every field of :class:`OutboxMessage`, in field order, with how it is written out."""

_JSON = tuple((field.name, field.json) for field in FIELDS)


WireField = tuple[str, int, Spell | None, bool]
"""How one broker carries one field: ``(name, position, spell, optional)``, its name on the wire,
where it is in the message, how it is written, and whether it may be unset (:class:`Field`).

A plain tuple, not a named one: a publisher unpacks one per field of every message, and CPython
unpacks an exact tuple on a fast path that a named tuple misses."""


def wire_fields(
    name: Callable[[str], str], *, text: bool, elsewhere: Collection[str] = ()
) -> tuple[WireField, ...]:
    """One broker's table of the fields it carries by name: built once, at import.

    ``name`` turns a field's name into the broker's (its header naming convention); ``text``
    picks the string spelling (for brokers whose headers hold only text) over the JSON one.
    ``elsewhere`` are the fields the broker carries in a place of its own (the body, a record
    key, the task name) or not at all. A name there that is not a field is refused, so a field
    renamed here cannot leave a publisher carrying it twice, under its old role and as a header.
    """
    unknown = sorted(set(elsewhere) - set(OutboxMessage._fields))
    if unknown:
        raise PublisherError(
            f"{unknown!r} are not fields of OutboxMessage, whose fields are "
            f"{', '.join(OutboxMessage._fields)}; fix the publisher's fields carried elsewhere."
        )
    return tuple(
        (name(field.name), field.position, field.text if text else field.json, field.optional)
        for field in FIELDS
        if field.name not in elsewhere
    )


def wire_name(table: tuple[WireField, ...], field: str) -> str:
    """The name ``table`` (one broker's :func:`wire_fields`) gives ``field``: what a consumer of
    that broker reads it under. ``KeyError`` if the broker carries it elsewhere."""
    position = OutboxMessage._fields.index(field)
    for name, at, _spell, _optional in table:
        if at == position:
            return name
    raise KeyError(field)


def spelled(message: OutboxMessage, table: tuple[WireField, ...]) -> dict[str, Any]:
    """``message``'s fields as ``table`` names and spells them, unset optional ones left out.

    Leaving them out rather than sending an empty value lets a consumer tell "no tenant" from a
    tenant named ``""``, and some brokers' fields cannot hold "no value" at all. A ``None`` that
    is a value, an ``input`` of JSON ``null``, is spelled like any other.
    """
    fields: dict[str, Any] = {}
    for name, position, spell, optional in table:
        value = message[position]
        if value is None and optional:
            continue
        fields[name] = value if spell is None else spell(value)
    return fields
