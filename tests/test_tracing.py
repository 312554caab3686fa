"""OpenTelemetry PRODUCER spans around the relay's publishes (:mod:`sqla_outbox.tracing`).

Real PostgreSQL, a real relay, and for the end-to-end tests the real HTTP webhook publisher
against the local receiver of ``brokers/endpoint.py``. Spans come from the SDK's
``TracerProvider`` recording into an ``InMemorySpanExporter`` through a ``SimpleSpanProcessor``
(so a span is exported the moment it ends), set as the *global* provider: the relay has no
provider parameter and uses the global one, as an application's would.

The API lets the global provider be set once per process. The ``spans`` fixture resets the API's
globals before and after each test, the way OpenTelemetry's own ``reset_trace_globals`` test
utility does, so every test starts with no provider configured and leaves none behind.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once
from sqlalchemy import Engine
from support import MakeRelay, ReturnsCoroutines, TextlessError, row, stage_inputs

from sqla_outbox.errors import BrokerUnavailableError, PublishError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.tracing import GENERIC_SYSTEM, trace_publish, trace_publish_batch

STORED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
"""A traceparent as an enqueuing request outside this process would have stored it."""


def reset_trace_globals() -> None:
    """Forget the global tracer provider, as ``opentelemetry.test.globals_test`` does."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()


@pytest.fixture
def no_sdk() -> Iterator[None]:
    """No tracer provider configured: the API's default, as in a process without an SDK."""
    reset_trace_globals()
    yield
    reset_trace_globals()


@pytest.fixture
def spans(no_sdk: None) -> Iterator[InMemorySpanExporter]:
    """An SDK provider set as the global one, exporting every finished span into memory."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()


@pytest.fixture
def endpoint() -> Iterator[Any]:
    """A webhook receiver (``brokers/endpoint.py``), shut when the test ends."""
    pytest.importorskip("httpx", reason="httpx is not installed: pip install 'sqla-outbox[http]'")
    from brokers.endpoint import Endpoint  # noqa: PLC0415 - needs httpx only for the publisher

    server = Endpoint()
    yield server
    server.shut()


# --- helpers -----------------------------------------------------------------------------------


def webhook(endpoint: Any) -> Any:
    from sqla_outbox.publishers.http_webhook import WebhookPublisher  # noqa: PLC0415 - httpx

    return WebhookPublisher(endpoint.url(), timeout=5)


def enqueue_in_span(engine: Engine, name: str, **options: Any) -> tuple[OutboxMessage, Any]:
    """Enqueue one job inside a request span named ``name``; the message and the span's
    context. The enqueue stores that span's traceparent (sqla_outbox.tracing)."""
    with trace.get_tracer("tests").start_as_current_span(name) as request:
        [message] = stage_inputs(engine, "send_receipt", [{"order": name}], **options)
    return message, request.get_span_context()


def producers(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    """The finished PRODUCER spans, in the order they started."""
    finished = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    return sorted(finished, key=lambda s: s.start_time or 0)


def parse(traceparent: str) -> tuple[int, int, int]:
    """Trace id, parent (span) id and flags of a version-00 W3C traceparent."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00", traceparent
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)


def header(request: Any, name: str) -> str:
    """A request header, whatever case the client sent it in."""
    [value] = [v for k, v in request.headers.items() if k.lower() == name.lower()]
    return str(value)


def carries(traceparent: str | None, span: ReadableSpan) -> bool:
    """``traceparent`` is ``span``'s own context: its trace, with it as the parent."""
    assert traceparent is not None and span.context is not None
    trace_id, parent_id, _flags = parse(traceparent)
    return (trace_id, parent_id) == (span.context.trace_id, span.context.span_id)


class BatchBroker:
    """A batch publisher that records what it was handed and can refuse one message.

    ``refuse`` (a message id) makes the batch holding it raise ``failure`` with ``published`` =
    that message's index, as a broker confirming a prefix does.
    """

    messaging_system = "test-broker"

    def __init__(self, refuse: Any = None, failure: type[Exception] = PublishError) -> None:
        self.batches: list[list[OutboxMessage]] = []
        self.refuse = refuse
        self.failure = failure

    def publish(self, message: OutboxMessage) -> None:
        self.publish_batch([message])

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        self.batches.append(list(messages))
        for index, message in enumerate(messages):
            if message.id == self.refuse:
                raise self.failure(f"refused {message.id}", published=index)


# --- the request's trace, through the webhook --------------------------------------------------


def test_publish_span_is_a_child_of_the_request_and_the_webhook_gets_its_context(
    pg_engine: Engine, make_relay: MakeRelay, spans: InMemorySpanExporter, endpoint: Any
) -> None:
    """A message enqueued inside a request span is published in a PRODUCER span whose parent is
    that request span, named and attributed by the messaging conventions; the endpoint receives
    the publish span's own context (same trace, the publish span as parent) in ``traceparent``,
    while the row keeps the request's."""
    message, request = enqueue_in_span(pg_engine, "POST /orders", queue="receipts")
    assert make_relay(pg_engine, webhook(endpoint)).drain().published == 1

    [span] = producers(spans)
    assert span.parent is not None and span.context is not None
    assert (span.parent.trace_id, span.parent.span_id) == (request.trace_id, request.span_id)
    assert span.context.trace_id == request.trace_id
    assert span.name == "publish receipts"
    assert span.status.status_code is StatusCode.UNSET
    assert dict(span.attributes or {}) == {
        "messaging.system": "webhook",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": "receipts",
        "messaging.message.id": str(message.id),
        "sqla_outbox.job": "send_receipt",
        "sqla_outbox.idempotency_key": message.idempotency_key,
    }

    [received] = endpoint.requests
    assert carries(header(received, "traceparent"), span)
    assert carries(received.message["traceparent"], span)  # the JSON body's copy too
    assert parse(row(pg_engine, message).traceparent)[1] == request.span_id


@pytest.mark.parametrize(
    "answer", [(500, "WebhookError"), (503, "WebhookUnavailableError")], ids=["refused", "outage"]
)
def test_a_failed_publish_records_the_exception_and_error_status(
    pg_engine: Engine,
    make_relay: MakeRelay,
    spans: InMemorySpanExporter,
    endpoint: Any,
    answer: tuple[int, str],
) -> None:
    """A publish that raises, whether the broker refused the message or could not take any
    (a ``BrokerUnavailableError``), ends its span with the exception recorded as an event,
    ``error.type`` set, and status ERROR; the relay still sees the failure as it would
    untraced."""
    status, error = answer
    message, _request = enqueue_in_span(pg_engine, "POST /orders", queue="receipts")
    endpoint.answers[str(message.id)] = (status, "no", {})

    result = make_relay(pg_engine, webhook(endpoint)).drain()

    assert (result.published, result.failed, result.outage) == (0, True, status == 503)
    [span] = producers(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None and span.status.description.startswith(error)
    qualified = f"sqla_outbox.publishers.http_webhook.{error}"
    assert (span.attributes or {})["error.type"] == qualified
    [event] = span.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == qualified
    [received] = endpoint.requests
    assert carries(header(received, "traceparent"), span)


def test_an_error_without_text_fails_its_span_and_is_charged_as_raised(
    pg_engine: Engine, make_relay: MakeRelay, spans: InMemorySpanExporter
) -> None:
    """A publisher error whose ``str()`` raises: the SDK cannot record it as an event, yet the
    span ends in ERROR naming it, and the relay charges the row with that error, not with the
    ``ValueError`` its ``__str__`` raised (which the wrapper let escape instead)."""
    message, _request = enqueue_in_span(pg_engine, "POST /orders")

    def publish(_message: OutboxMessage) -> None:
        raise TextlessError

    result = make_relay(pg_engine, publish).drain()

    assert (result.published, result.failed, result.outage) == (0, True, False)
    [span] = producers(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "TextlessError (its str() raised)"
    assert row(pg_engine, message).last_error == "TextlessError (its str() raised)"


@pytest.mark.parametrize("form", ["publish", "publish_batch"])
def test_a_publish_returning_a_coroutine_fails_its_span(
    pg_engine: Engine, make_relay: MakeRelay, spans: InMemorySpanExporter, form: str
) -> None:
    """A publisher that returns a coroutine has sent nothing: its span ends in ERROR with the
    ``TypeError`` the relay charges the row with (it ended OK, with the row charged)."""
    message, _request = enqueue_in_span(pg_engine, "POST /orders")
    wrapped = ReturnsCoroutines()
    publisher: Any = wrapped if form == "publish_batch" else wrapped.publish
    result = make_relay(pg_engine, publisher).drain()

    assert (result.published, result.failed) == (0, True)
    [span] = producers(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "TypeError"
    assert (span.status.description or "").startswith("TypeError: the publisher returned")
    assert (row(pg_engine, message).last_error or "").startswith(span.status.description or "?")


# --- batches -----------------------------------------------------------------------------------


def test_a_batch_gets_one_span_per_message_each_under_its_own_request(
    pg_engine: Engine, make_relay: MakeRelay, spans: InMemorySpanExporter
) -> None:
    """A batch publisher's call is covered by one PRODUCER span per message, each parented on
    the request that enqueued that message and handed to the broker in that message; the
    publisher's own ``messaging_system`` names the system."""
    enqueued = [enqueue_in_span(pg_engine, f"request {n}", queue="batch") for n in range(3)]
    broker = BatchBroker()

    assert make_relay(pg_engine, broker).drain().published == 3

    [batch] = broker.batches
    found = producers(spans)
    assert len(found) == 3
    for (message, request), span, handed in zip(enqueued, found, batch, strict=True):
        assert span.parent is not None and span.parent.span_id == request.span_id
        assert (span.attributes or {})["messaging.message.id"] == str(message.id)
        assert (span.attributes or {})["messaging.batch.message_count"] == 3
        assert (span.attributes or {})["messaging.system"] == "test-broker"
        assert span.status.status_code is StatusCode.UNSET
        assert handed.id == message.id and carries(handed.traceparent, span)


@pytest.mark.parametrize("failure", [PublishError, BrokerUnavailableError])
def test_a_batch_failure_is_recorded_on_the_spans_it_left_unconfirmed(
    pg_engine: Engine,
    make_relay: MakeRelay,
    spans: InMemorySpanExporter,
    failure: type[Exception],
) -> None:
    """When a batch confirms a prefix and raises (``published=1`` of 3), the confirmed
    message's span is left unset, the message the error belongs to records the exception with
    status ERROR, and the later one, which this call did not publish, is ERROR "not confirmed"
    without a copy of the exception."""
    first, failed, last = (enqueue_in_span(pg_engine, f"r{n}", queue="batch")[0] for n in range(3))
    broker = BatchBroker(refuse=failed.id, failure=failure)

    make_relay(pg_engine, broker).drain()

    spans_of = {
        m.id: [s for s in producers(spans) if _message_id(s) == str(m.id)]
        for m in (first, failed, last)
    }
    assert spans_of[first.id][0].status.status_code is StatusCode.UNSET
    refused = spans_of[failed.id][0]
    assert refused.status.status_code is StatusCode.ERROR
    assert [e.name for e in refused.events] == ["exception"]
    assert (refused.attributes or {})["error.type"] == f"sqla_outbox.errors.{failure.__name__}"
    unconfirmed = spans_of[last.id][0]
    assert unconfirmed.status.status_code is StatusCode.ERROR
    assert unconfirmed.status.description is not None
    assert unconfirmed.status.description.startswith("not confirmed")
    assert not unconfirmed.events
    if failure is PublishError:
        # A refusal holds back only its own transaction: the last message goes out in a
        # second batch, under a second span of its own.
        assert [len(b) for b in broker.batches] == [3, 1]
        assert spans_of[last.id][1].status.status_code is StatusCode.UNSET
    else:
        assert [len(b) for b in broker.batches] == [3]  # an outage ends the pass


def _message_id(span: ReadableSpan) -> object:
    return (span.attributes or {}).get("messaging.message.id")


# --- without an SDK, and without a traceparent -------------------------------------------------


def test_without_an_sdk_messages_are_published_unchanged(
    pg_engine: Engine, make_relay: MakeRelay, no_sdk: None
) -> None:
    """With the API installed but no tracer provider configured, the publisher gets each
    message with its stored traceparent, untouched, and nothing raises."""
    [message] = stage_inputs(pg_engine, "send_receipt", [{}], traceparent=STORED)
    received: list[OutboxMessage] = []

    assert make_relay(pg_engine, received.append).drain().published == 1

    assert [(m.id, m.traceparent) for m in received] == [(message.id, STORED)]


def test_an_sdk_configured_after_the_relay_is_used_from_the_next_publish(
    pg_engine: Engine, make_relay: MakeRelay, no_sdk: None
) -> None:
    """The relay looks at the global provider on every publish, so one set after the relay
    was built (as an application configuring OpenTelemetry late does) traces the next one."""
    received: list[OutboxMessage] = []
    relay = make_relay(pg_engine, received.append)
    stage_inputs(pg_engine, "send_receipt", [{}], traceparent=STORED)
    relay.drain()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    stage_inputs(pg_engine, "send_receipt", [{}], traceparent=STORED)

    relay.drain()

    [span] = producers(exporter)
    assert received[0].traceparent == STORED
    assert carries(received[1].traceparent, span)
    assert span.parent is not None and span.parent.span_id == parse(STORED)[1]
    provider.shutdown()


def test_without_opentelemetry_the_publisher_is_not_wrapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If ``opentelemetry`` cannot be imported, the relay's callables are the publisher's own,
    not wrappers: tracing costs nothing at all."""
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)  # as if not installed
    broker = BatchBroker()
    publish, publish_batch = broker.publish, broker.publish_batch

    assert trace_publish(publish, broker) is publish
    assert trace_publish_batch(publish_batch, broker) is publish_batch
    assert trace_publish_batch(None, broker) is None


def test_a_message_without_traceparent_gets_a_root_span_whose_context_it_carries(
    pg_engine: Engine, make_relay: MakeRelay, spans: InMemorySpanExporter, endpoint: Any
) -> None:
    """A message enqueued outside any span is published in a PRODUCER span with no parent (the
    relay's thread has no current span), and the endpoint still receives that span's context,
    so the consumer joins the publish's trace."""
    [message] = stage_inputs(pg_engine, "send_receipt", [{}], queue="receipts")
    assert message.traceparent is None

    make_relay(pg_engine, webhook(endpoint)).drain()

    [span] = producers(spans)
    assert span.parent is None
    [received] = endpoint.requests
    assert carries(header(received, "traceparent"), span)


def test_a_message_without_traceparent_is_parented_on_the_current_span(
    pg_engine: Engine, make_relay: MakeRelay, spans: InMemorySpanExporter
) -> None:
    """Run inside a span of the caller's (a drain in a scheduled job's span), a message
    without a traceparent gets its publish span under that span; a plain callable publisher
    gets the generic ``messaging.system``."""
    stage_inputs(pg_engine, "send_receipt", [{}], queue="receipts")
    received: list[OutboxMessage] = []
    relay = make_relay(pg_engine, received.append)

    with trace.get_tracer("tests").start_as_current_span("nightly job") as job:
        relay.drain()

    [span] = producers(spans)
    assert span.parent is not None and span.parent.span_id == job.get_span_context().span_id
    assert (span.attributes or {})["messaging.system"] == GENERIC_SYSTEM
    assert carries(received[0].traceparent, span)
