"""The message's fields are defined once, in :mod:`sqla_outbox.message`, and derived everywhere.

These tests hold every other list of the fields to that definition: the table's columns, the
relay's claim, ``to_dict``, each broker's headers, ``build_message`` and ``enqueue``. They are
what fails when a field is added to :class:`~sqla_outbox.OutboxMessage` and one of the places
that must know about it does not. They read what each publisher actually builds and find the
fields in it by value, never through the publisher's own table, so a publisher that drops a
field fails whatever its table says; and they pin each broker's wire names, which consumers
depend on.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import uuid
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import httpx
import pytest
from brokers.adapters import celery_tasks as celery_adapter
from brokers.adapters import kafka as kafka_adapter
from brokers.adapters import nats_jetstream as nats_adapter
from celery import Celery
from sqlalchemy import String, Table

import sqla_outbox as outbox
from sqla_outbox import queries
from sqla_outbox.errors import ConfigurationError, PublisherError
from sqla_outbox.message import FIELDS, OutboxMessage, compact_json, wire_fields
from sqla_outbox.model import OutboxRow
from sqla_outbox.publishers import (
    celery_tasks,
    http_webhook,
    kafka,
    nats_jetstream,
    rabbitmq,
    redis_streams,
)
from sqla_outbox.validation import build_message

FIELD_NAMES = OutboxMessage._fields
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

# Every field set, each to a value no other field has, so a field is found by its value.
FULL = OutboxMessage(
    id=uuid.UUID("0190b1f4-7c1e-7a3b-9d2e-5f6a7b8c9d0e"),
    job="send_receipt",
    queue="emails",
    input={"order": 7, "name": "Zoë"},
    idempotency_key="order-7",
    max_attempts=5,
    run_at=dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone.utc),
    staged_at=dt.datetime(2024, 5, 6, 7, 8, 8, tzinfo=dt.timezone.utc),
    tenant_id="acme",
    traceparent=TRACEPARENT,
    enqueued_by="checkout",
    ordering_key="customer-42",
)
# Only what every message has; input None is JSON null, a value, not an unset field.
BARE = FULL._replace(
    input=None, tenant_id=None, traceparent=None, enqueued_by=None, ordering_key=None
)

AS_JSON = {
    "id": "0190b1f4-7c1e-7a3b-9d2e-5f6a7b8c9d0e",
    "job": "send_receipt",
    "queue": "emails",
    "input": {"order": 7, "name": "Zoë"},
    "idempotency_key": "order-7",
    "max_attempts": 5,
    "run_at": "2024-05-06T07:08:09.123456+00:00",
    "staged_at": "2024-05-06T07:08:08+00:00",
    "tenant_id": "acme",
    "traceparent": TRACEPARENT,
    "enqueued_by": "checkout",
    "ordering_key": "customer-42",
}
"""``FULL`` as a JSON object holds it: what ``to_dict`` returns."""

AS_TEXT = {**AS_JSON, "input": '{"order":7,"name":"Zoë"}', "max_attempts": "5"}
"""``FULL`` as headers that hold only text spell it."""

TABLE: Table = OutboxRow.__table__  # type: ignore[assignment]

RELAY_COLUMNS = frozenset(
    {
        "claimed_by",
        "claimed_at",
        "published_at",
        "attempts",
        "last_error",
        "retry_at",
        "dead_at",
        "parked",
        "wake_at",
        "parked_behind",
    }
)
"""The table's columns that are the relay's bookkeeping, not part of a message."""


# --- the definition and the table ----------------------------------------------------------------


def test_the_fields_are_the_tables_message_columns_in_order_and_the_claims() -> None:
    """Every field is a column, in the table's order; every other column is the relay's own; and
    the claim returns the fields in the message's order (the relay builds messages by position).
    """
    columns = [column.name for column in TABLE.columns]
    assert [name for name in columns if name in FIELD_NAMES] == list(FIELD_NAMES)
    assert set(columns) - set(FIELD_NAMES) == RELAY_COLUMNS, (
        "a new column is either a message field (add it to OutboxMessage) or the relay's own "
        "(add it to RELAY_COLUMNS)"
    )
    assert queries.MESSAGE_FIELDS == FIELD_NAMES


def test_the_unset_fields_are_the_optional_ones() -> None:
    """A field the definition calls optional (annotated ``X | None``) is one that defaults to
    ``None``, and its column is nullable; no other field is."""
    optional = [field.name for field in FIELDS if field.optional]
    assert [field.name for field in FIELDS] == list(FIELD_NAMES)
    assert optional == list(OutboxMessage._field_defaults)
    assert all(OutboxMessage._field_defaults[name] is None for name in optional)
    assert optional == [name for name in FIELD_NAMES if TABLE.c[name].nullable]


def test_to_dict_is_every_field_in_order_spelled_for_json() -> None:
    """``to_dict`` has a key per field, in field order: ids and times as text, the rest as is,
    and an unset field as ``None``."""
    assert list(FULL.to_dict()) == list(FIELD_NAMES)
    assert FULL.to_dict() == AS_JSON
    assert json.loads(json.dumps(FULL.to_dict())) == AS_JSON
    bare = BARE.to_dict()
    assert list(bare) == list(FIELD_NAMES)
    assert {name for name, value in bare.items() if value is None} == {
        "input",
        "tenant_id",
        "traceparent",
        "enqueued_by",
        "ordering_key",
    }


# --- the publishers ------------------------------------------------------------------------------


def _kafka(message: OutboxMessage) -> dict[str, Any]:
    return {name: value.decode() for name, value in kafka.record_headers(message)}


def _rabbitmq(message: OutboxMessage) -> dict[str, Any]:
    headers: dict[str, Any] = rabbitmq._properties(message).headers
    return headers


def _posted(message: OutboxMessage) -> httpx.Request:
    """The request the webhook publisher sends for ``message``, to an endpoint that takes it."""
    requests: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(204)

    publisher = http_webhook.WebhookPublisher("http://endpoint.invalid/hook")
    publisher._client = httpx.Client(transport=httpx.MockTransport(answer))
    with publisher:
        publisher.publish(message)
    [request] = requests
    return request


def _webhook(message: OutboxMessage) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(_posted(message).content)
    return body


# name, module, what it builds for a message (its header or field names -> values), spelling
Builder = tuple[ModuleType, Callable[[OutboxMessage], Mapping[str, Any]], Mapping[str, Any]]
BUILDERS: dict[str, Builder] = {
    "kafka": (kafka, _kafka, AS_TEXT),
    "nats": (nats_jetstream, nats_jetstream.message_headers, AS_TEXT),
    "redis": (redis_streams, redis_streams.entry_fields, AS_TEXT),
    "rabbitmq": (rabbitmq, _rabbitmq, AS_JSON),
    "celery": (celery_tasks, celery_tasks.task_headers, AS_JSON),
    "webhook": (http_webhook, _webhook, AS_JSON),
}

WIRE_NAMES: dict[str, dict[str, str]] = {
    # The brokers' own suites read the fields back from the live brokers by these names.
    "kafka": kafka_adapter.HEADERS,
    "nats": nats_adapter.HEADERS,
    "redis": {name: name for name in FIELD_NAMES},
    "rabbitmq": {name: name for name in FIELD_NAMES if name != "input"},
    "celery": celery_adapter.HEADERS,
    # The body is to_dict(); four fields are headers too (see the webhook's own test).
    "webhook": {name: name for name in FIELD_NAMES},
}
"""Where each broker carries each field: the names consumers read (docs/brokers/*.md)."""

EXTRAS: dict[str, dict[str, str]] = {
    "kafka": {"content-type": "application/json"},
    "nats": {"Content-Type": "application/json"},
}
"""What a broker sends besides the fields."""


@pytest.mark.parametrize("broker", BUILDERS)
def test_each_publisher_carries_every_field_but_those_it_carries_elsewhere(broker: str) -> None:
    """Each field's value is in what the publisher builds, unless the publisher names the field
    in its ``CARRIED_ELSEWHERE``, whose every key is a field."""
    module, build, spelling = BUILDERS[broker]
    elsewhere = module.CARRIED_ELSEWHERE
    assert set(elsewhere) <= set(FIELD_NAMES)
    values = list(build(FULL).values())
    carried = {name for name in FIELD_NAMES if spelling[name] in values}
    assert carried == set(FIELD_NAMES) - set(elsewhere), "missing or unexpected fields"


@pytest.mark.parametrize("broker", BUILDERS)
def test_each_publisher_keeps_its_wire_names(broker: str) -> None:
    """Each field travels under the name the broker's consumers read, spelled as that broker's
    headers hold it, and nothing else travels but the broker's own extras."""
    _module, build, spelling = BUILDERS[broker]
    names = WIRE_NAMES[broker]
    expected = {names[field]: spelling[field] for field in names} | EXTRAS.get(broker, {})
    assert dict(build(FULL)) == expected


@pytest.mark.parametrize("broker", BUILDERS)
def test_unset_fields_are_left_out_or_null_and_the_rest_always_sent(broker: str) -> None:
    """An unset optional field is absent (Celery: ``None``, so ``self.request.tenant_id`` reads
    without ``getattr``; the webhook's body: ``null``, as ``to_dict``), never an empty string;
    every other field is sent, ``input``'s JSON ``null`` included where input is a field."""
    module, build, spelling = BUILDERS[broker]
    names = WIRE_NAMES[broker]
    built = build(BARE)
    optional = {field.name for field in FIELDS if field.optional} & set(names)
    keeps_none = broker in ("celery", "webhook")
    for field in optional:
        if keeps_none:
            assert built[names[field]] is None, field
        else:
            assert names[field] not in built, field
    for field in set(names) - optional:
        assert names[field] in built, field
    if "input" in names:
        assert built[names["input"]] == (None if spelling is AS_JSON else "null")
    assert "" not in built.values()
    assert set(module.CARRIED_ELSEWHERE) & set(names) == set()


def test_the_webhook_sends_four_fields_as_headers_too() -> None:
    """An endpoint can deduplicate, route and trace before parsing the body: the idempotency
    key, id, job and trace context are also headers (the trace context only when set)."""
    own = {"content-type": "application/json"}
    headers = {
        "idempotency-key": "order-7",
        "x-outbox-id": AS_TEXT["id"],
        "x-outbox-job": "send_receipt",
        "traceparent": TRACEPARENT,
    }
    assert http_webhook.message_headers(FULL) == {
        "Idempotency-Key": "order-7",
        "X-Outbox-Id": AS_TEXT["id"],
        "X-Outbox-Job": "send_receipt",
        "traceparent": TRACEPARENT,
        "Content-Type": "application/json",
    }
    for message, expected in ((FULL, headers), (BARE, headers | {"traceparent": None})):
        sent = _posted(message).headers
        for name, value in (expected | own).items():
            assert sent.get(name) == value, name


def test_the_fields_carried_elsewhere_arrive_there() -> None:
    """RabbitMQ: input is the body, and the idempotency key, job and staging time are also
    properties. Celery: job is the task name, input its arguments, the idempotency key its id.
    (Kafka's record value and key are pinned against a live broker, in tests/brokers.)"""
    properties = rabbitmq._properties(FULL)
    assert json.loads(rabbitmq._body(FULL)) == FULL.input
    assert (properties.message_id, properties.type) == ("order-7", "send_receipt")
    assert properties.timestamp == int(FULL.staged_at.timestamp())

    sent: list[tuple[str, dict[str, Any]]] = []
    app = Celery("fields", set_as_current=False)
    app.send_task = lambda name, **options: sent.append((name, options))
    celery_tasks.CeleryPublisher(app)._send(None, FULL)
    [(name, options)] = sent
    assert (name, options["kwargs"], options["task_id"]) == ("send_receipt", FULL.input, "order-7")


def test_a_publisher_cannot_name_a_field_that_does_not_exist() -> None:
    """A publisher's fields carried elsewhere must be fields, so one left naming a renamed field
    fails at import instead of carrying its successor twice."""
    with pytest.raises(PublisherError, match=r"\['odering_key'\] are not fields"):
        wire_fields(lambda name: name, text=True, elsewhere={"odering_key"})


@pytest.mark.parametrize(
    "value",
    [
        None,
        {"order_id": 12345, "items": [1, 2.5, True, None], "note": "caf\u00e9 \u2603 \U0001f600"},
        'a "quoted" line\nbreak',
        [float("inf"), float("nan"), -0.0, 10**30],
        {"nested": {"deep": [{"k": "v"}]}, "": ""},
    ],
)
def test_compact_json_spells_input_as_json_dumps_does(value: Any) -> None:
    """The encoder built once writes the text ``json.dumps`` with the same options writes."""
    assert compact_json(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_compact_json_refuses_what_json_dumps_refuses() -> None:
    for bad in ({"when": dt.date(2026, 1, 1)}, {1j: "key"}):
        with pytest.raises(TypeError):
            json.dumps(bad, ensure_ascii=False, separators=(",", ":"))
        with pytest.raises(TypeError):
            compact_json(bad)


def test_input_is_compact_json_where_headers_hold_text() -> None:
    """The text spelling of ``input`` is the one every broker's payload uses."""
    assert redis_streams.entry_fields(FULL)["input"] == compact_json(FULL.input)


# --- validation and enqueue ----------------------------------------------------------------------


def _build(**fields: Any) -> OutboxMessage:
    """``build_message`` as ``enqueue`` calls it, every argument at its default but ``fields``."""
    defaults = dict.fromkeys(
        ("queue", "run_at", "idempotency_key", "max_attempts", "tenant_id", "enqueued_by")
    )
    return build_message(
        **{
            "job": "send_receipt",
            "input": None,
            "staged_at": FULL.staged_at,
            "traceparent": None,
            **defaults,
            **fields,
        }
    )


def test_build_message_takes_every_field_and_puts_each_in_the_message() -> None:
    """Every field but the id (the library's) is an argument of ``build_message``, and what is
    passed is what the message holds: a field it forgot would silently be ``None``."""
    given = {name: getattr(FULL, name) for name in FIELD_NAMES if name != "id"}
    assert set(given) <= set(inspect.signature(build_message).parameters)
    built = _build(**given)
    assert {name: getattr(built, name) for name in given} == given


def test_enqueue_takes_every_field_a_caller_chooses() -> None:
    """``enqueue`` has an argument for every field but the id and the staging time, which the
    library sets."""
    parameters = set(inspect.signature(outbox.enqueue).parameters)
    assert set(FIELD_NAMES) - {"id", "staged_at"} <= parameters


TEXT_COLUMNS = {
    name: column.type.length
    for name in FIELD_NAMES
    if isinstance((column := TABLE.c[name]).type, String) and column.type.length is not None
}


def test_the_text_fields_have_text_columns() -> None:
    """The fields the definition writes as they are (its ``str`` fields) are exactly those in
    string columns, so each is checked below."""
    as_is = {field.name for field in FIELDS if field.json is None and field.text is None}
    assert set(TEXT_COLUMNS) == as_is
    assert set(TEXT_COLUMNS) > {"job", "queue", "idempotency_key", "traceparent"}


@pytest.mark.parametrize("name", TEXT_COLUMNS)
def test_every_text_field_is_refused_longer_than_its_column(name: str) -> None:
    """Each field stored in a string column is refused at the call, one character past the
    column's length, rather than at commit."""
    length = TEXT_COLUMNS[name]
    _build(**{name: TRACEPARENT if name == "traceparent" else "b" * length})
    with pytest.raises(ConfigurationError):
        _build(**{name: "b" * (length + 1)})
