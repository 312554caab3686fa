"""Trace context: read when a job is enqueued, continued when the relay publishes it.

OpenTelemetry is optional (``pip install "sqla-outbox[otel]"``, the API only; the application
brings the SDK and exporters).

Enqueue: :func:`current_traceparent`
    The W3C ``traceparent`` of the span that is enqueuing is stored with the message. It is read
    at staging time, not at publish time: the relay runs later, in its own thread, with no
    request span in scope, so a trace read there would belong to nobody. If the application
    never imported ``opentelemetry.trace`` it cannot have a recording span, so nothing is
    imported and an enqueue pays nothing for tracing.

Publish: :func:`trace_publish`, :func:`trace_publish_batch`
    The relay wraps its publisher's callables with these. With an SDK configured, each message
    is published inside a ``PRODUCER`` span that follows the OpenTelemetry messaging semantic
    conventions:

    * its **parent is the message's stored** ``traceparent`` (the request that enqueued it),
      extracted with the W3C TraceContext propagator. A message without one gets a span
      parented on whatever is current in the relay's thread: usually nothing, so a new trace.
    * the publisher is handed ``message._replace(traceparent=<this span's traceparent>)``.
      Every bundled publisher copies ``message.traceparent`` into what its broker carries
      (headers, stream fields, task headers), so the broker receives the *publish span's*
      context and the consumer's span becomes its child: request -> publish -> consume, one
      trace. While the publisher runs the span is current, so a client library's own
      instrumentation (httpx, pika, Celery) nests under it.
    * name ``publish <queue>``; attributes ``messaging.system`` (:func:`messaging_system`),
      ``messaging.operation.type`` = ``send`` (the conventions renamed ``publish`` to ``send``),
      ``messaging.operation.name`` = ``publish``, ``messaging.destination.name`` = the queue,
      ``messaging.message.id`` = the message id, and ``sqla_outbox.job``,
      ``sqla_outbox.idempotency_key``.
    * a publish that raises (anything: a refusal, a :class:`~sqla_outbox.BrokerUnavailableError`,
      even ``KeyboardInterrupt``) records the exception, sets ``error.type`` to its fully
      qualified class name and the status to ``ERROR``, and re-raises it unchanged: the relay
      sees exactly what it would without tracing. A publish that returns a coroutine has sent
      nothing, and fails in its span with the ``TypeError`` the relay charges
      (:func:`~sqla_outbox.publishing.refuse_awaitable`).
    * a batch publisher (``publish_batch``) gets one span per message, all started before the
      call and ended after it, with ``messaging.batch.message_count``. If the call raises, the
      messages the error says were confirmed (its ``published`` count, read exactly as
      :mod:`sqla_outbox.publishing` reads it) keep an unset status; the message the error
      belongs to records the exception; the messages after it are ``ERROR`` too ("not
      confirmed"), since this call did not publish them.

What it costs without an SDK
    If OpenTelemetry is not installed, the relay's callables are returned unwrapped. If it is
    installed, the wrapper reads the API's global tracer provider on every call (one attribute
    read) and, while none is configured, calls the publisher directly: tens of nanoseconds a
    message, no span, no context switch, the message passed on untouched. Reading it per call
    is what makes an SDK configured *after* the relay was built (or replaced, as tests do) take
    effect at the next publish. An SDK provider with ``OTEL_SDK_DISABLED`` set, or the API's
    no-op provider set explicitly, counts as none.

The traps
    * Spans come from the *global* tracer provider (``trace.set_tracer_provider``, or
      ``OTEL_PYTHON_TRACER_PROVIDER`` read when the relay is built). A provider you only hold
      in a variable is not seen by the relay.
    * The ``traceparent`` a publisher receives is the publish span's, not the one stored at
      enqueue: same trace id, a different parent id. The webhook publisher's JSON body carries
      it too. The stored one stays in the table.
    * A retried message gets a new publish span per attempt, so a consumer that receives it
      twice sees two different parent ids, in the same trace.
    * The span's duration is the publisher's call. For a batch, every span of the batch has the
      duration of the whole call.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqla_outbox.logs import describe_error
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers.schemes import BROKERS
from sqla_outbox.publishing import ENDS_PROCESS, confirmed_count, is_outage, refuse_awaitable

if TYPE_CHECKING:
    from types import ModuleType

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "GENERIC_SYSTEM",
    "SYSTEMS",
    "TRACER_NAME",
    "current_traceparent",
    "messaging_system",
    "trace_publish",
    "trace_publish_batch",
]

PublishOne = Callable[[OutboxMessage], object]
PublishMany = Callable[[Sequence[OutboxMessage]], object]

TRACER_NAME = "sqla_outbox"
"""The instrumentation scope name of the relay's spans."""

GENERIC_SYSTEM = "sqla_outbox"
"""``messaging.system`` for a publisher that names no system of its own."""

SYSTEMS = {broker.module: broker.system for broker in BROKERS.values()}
"""``messaging.system`` of each bundled broker publisher, by the module that defines it (from
:data:`~sqla_outbox.publishers.schemes.BROKERS`, where each broker is listed once)."""


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` header of the current recording span, else ``None``."""
    otel_trace = sys.modules.get("opentelemetry.trace")
    if otel_trace is None or not otel_trace.get_current_span().is_recording():
        return None
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415 - optional
        TraceContextTextMapPropagator,
    )

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def messaging_system(publisher: object) -> str:
    """The ``messaging.system`` of ``publisher``'s spans.

    A non-empty string attribute ``publisher.messaging_system`` wins (how a publisher of your
    own names its broker); then :data:`SYSTEMS`, by the module its class (or a base class, or
    the function) comes from; else :data:`GENERIC_SYSTEM`.
    """
    declared = getattr(publisher, "messaging_system", None)
    if isinstance(declared, str) and declared:
        return declared
    # The classes first, so a subclass of a bundled publisher keeps its system; then the
    # module of a function or bound method (``Relay(engine, webhook.publish)``).
    modules: list[object] = [kind.__module__ for kind in type(publisher).__mro__]
    modules.append(getattr(publisher, "__module__", None))
    return next((SYSTEMS[m] for m in modules if m in SYSTEMS), GENERIC_SYSTEM)


def trace_publish(publish: PublishOne, publisher: object) -> PublishOne:
    """``publish``, publishing each message in a PRODUCER span (see the module docs).

    ``publisher`` is what the relay was given; it names the span's ``messaging.system``.
    Without OpenTelemetry installed, ``publish`` itself is returned.
    """
    otel_trace = _opentelemetry()
    if otel_trace is None:
        return publish
    spans = _Spans(otel_trace, messaging_system(publisher))
    configured = spans.configured

    def publish_traced(message: OutboxMessage) -> object:
        provider = configured()
        if provider is None:  # no SDK: the common case costs this one check
            return publish(message)
        tracer = spans.tracer(provider)
        if tracer is None:
            return publish(message)
        return spans.publish(tracer, publish, message)

    return publish_traced


def trace_publish_batch(publish_batch: PublishMany | None, publisher: object) -> PublishMany | None:
    """``publish_batch``, with one PRODUCER span per message (see the module docs).

    ``None`` (a publisher without ``publish_batch``) stays ``None``; without OpenTelemetry
    installed, ``publish_batch`` itself is returned.
    """
    otel_trace = None if publish_batch is None else _opentelemetry()
    if publish_batch is None or otel_trace is None:
        return publish_batch
    spans = _Spans(otel_trace, messaging_system(publisher))
    configured = spans.configured
    publish_many = publish_batch  # narrowed to not-None for the closure

    def publish_batch_traced(messages: Sequence[OutboxMessage]) -> object:
        provider = configured()
        if provider is None:
            return publish_many(messages)
        tracer = spans.tracer(provider)
        if tracer is None:
            return publish_many(messages)
        return spans.publish_batch(tracer, publish_many, messages)

    return publish_batch_traced


def _opentelemetry() -> ModuleType | None:
    """``opentelemetry.trace``, imported, or ``None`` if the API is not installed."""
    try:
        import opentelemetry.trace  # noqa: PLC0415 - optional
    except ImportError:
        return None
    # Loads a provider named by OTEL_PYTHON_TRACER_PROVIDER now: the per-call check below
    # reads the global directly, which only the API's getter fills from the environment.
    opentelemetry.trace.get_tracer_provider()
    return opentelemetry.trace


def _version() -> str:
    try:
        return importlib.metadata.version("sqla-outbox")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return ""


class _Spans:
    """Starts the spans of one relay's publisher with the tracer of the global provider.

    The tracer is looked up again whenever the global provider is not the one last seen, so
    an SDK configured after the relay was built is used from its next publish on.
    """

    def __init__(self, otel_trace: ModuleType, system: str) -> None:
        from opentelemetry import context  # noqa: PLC0415 - optional
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator,
        )
        from opentelemetry.trace.status import Status, StatusCode  # noqa: PLC0415

        self._otel = otel_trace
        self._attach = context.attach
        self._detach = context.detach
        self._propagator = TraceContextTextMapPropagator()
        self._status = Status
        self._error = StatusCode.ERROR
        self._kind = otel_trace.SpanKind.PRODUCER
        self._seen: object = None
        self._tracer: Tracer | None = None
        self.system = system
        if hasattr(otel_trace, "_TRACER_PROVIDER"):
            # The API's own global, None until a provider is set. get_tracer_provider() is the
            # public way to ask, but while none is set it also looks an environment variable up
            # on every call: about 0.5 us a message, ten times what this read costs.
            self.configured: Callable[[], object] = lambda: otel_trace._TRACER_PROVIDER
        else:  # pragma: no cover - an API that renamed its global: the public, slower way
            self.configured = otel_trace.get_tracer_provider

    def tracer(self, provider: object) -> Tracer | None:
        """The tracer of ``provider``, or ``None`` if it is a no-op one."""
        if provider is not self._seen:
            self._tracer = self._tracer_of(provider)
            self._seen = provider
        return self._tracer

    def _tracer_of(self, provider: object) -> Tracer | None:
        otel = self._otel
        if not isinstance(provider, otel.TracerProvider) or isinstance(
            provider, (otel.ProxyTracerProvider, otel.NoOpTracerProvider)
        ):
            return None
        tracer = provider.get_tracer(TRACER_NAME, _version())
        return None if isinstance(tracer, otel.NoOpTracer) else tracer

    def publish(self, tracer: Tracer, publish: PublishOne, message: OutboxMessage) -> object:
        """Call ``publish`` in the message's PRODUCER span, made current."""
        span = self._start(tracer, message, None)
        try:
            handed = self._handed(message, span)
            token = self._attach(self._otel.set_span_in_context(span))
            try:
                sent = publish(handed)
                refuse_awaitable(sent)  # a coroutine returned is a failed publish: in the span
                return sent
            finally:
                self._detach(token)
        except BaseException as error:  # all of them, re-raised: see the module docs
            self._failed(span, error)
            raise
        finally:
            span.end()

    def publish_batch(
        self, tracer: Tracer, publish_batch: PublishMany, messages: Sequence[OutboxMessage]
    ) -> object:
        """Call ``publish_batch`` with one PRODUCER span per message, started before the call
        and ended after it; a failure goes on the spans of the messages it left unconfirmed."""
        count = len(messages)
        spans = [self._start(tracer, message, count) for message in messages]
        try:
            sent = publish_batch([self._handed(m, s) for m, s in zip(messages, spans, strict=True)])
            refuse_awaitable(sent)
            return sent
        except BaseException as error:  # all of them, re-raised: see the module docs
            ended = isinstance(error, ENDS_PROCESS) or is_outage(error)
            # As the relay counts it (sqla_outbox.publishing): a refusal always leaves one
            # message to blame; an outage or a stop may come after every message was confirmed.
            confirmed = confirmed_count(error, count if ended else count - 1)
            if confirmed < count:
                self._failed(spans[confirmed], error)
                for span in spans[confirmed + 1 :]:
                    self._failed(span, error, record=False)
            raise
        finally:
            for span in spans:
                span.end()

    def _start(self, tracer: Tracer, message: OutboxMessage, batch: int | None) -> Span:
        attributes: dict[str, AttributeValue] = {
            "messaging.system": self.system,
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": message.queue,
            "messaging.message.id": str(message.id),
            "sqla_outbox.job": message.job,
            "sqla_outbox.idempotency_key": message.idempotency_key,
        }
        if batch is not None:
            attributes["messaging.batch.message_count"] = batch
        return tracer.start_span(
            f"publish {message.queue}",
            context=self._parent(message.traceparent),
            kind=self._kind,
            attributes=attributes,
        )

    def _parent(self, traceparent: str | None) -> Context | None:
        """The stored request context, or ``None``: the relay thread's current context."""
        if not traceparent:
            return None
        return self._propagator.extract({"traceparent": traceparent})

    def _handed(self, message: OutboxMessage, span: Span) -> OutboxMessage:
        """``message`` carrying ``span``'s ``traceparent`` (as it is if the span has none)."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._otel.set_span_in_context(span))
        traceparent = carrier.get("traceparent")
        if traceparent is None:
            return message
        return message._replace(traceparent=traceparent)

    def _failed(self, span: Span, error: BaseException, *, record: bool = True) -> None:
        """Mark ``span`` failed by ``error``: recorded as an event on the message it belongs
        to, only described on the batch's later messages, which it left unconfirmed."""
        kind = type(error)
        # Fully qualified, as the SDK writes exception.type and the conventions ask of error.type.
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        if record:
            # The SDK reads str(error): one whose __str__ raises is still named by the status.
            with contextlib.suppress(Exception):
                span.record_exception(error)
            description = describe_error(error)
        else:
            description = (
                f"not confirmed: the batch stopped at an earlier message ({kind.__name__})"
            )
        span.set_attribute("error.type", name)
        span.set_status(self._status(self._error, description))
