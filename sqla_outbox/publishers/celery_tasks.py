"""``CeleryPublisher``: each committed message becomes a Celery task, sent through your app.

The relay calls ``app.send_task(message.job, ...)`` for every message, in claim order, and marks
the row published only once the broker has the task. Workers need no change to run outbox jobs:
they are ordinary Celery tasks, named by the job.

What a message becomes
    * task name: ``message.job``; it must be the name a worker registered (``@app.task(name=...)``
      or the default ``module.function``).
    * arguments: a JSON object ``input`` becomes the task's keyword arguments; ``None`` means no
      arguments; any other value (a list, a string, a number) is the task's one positional
      argument. A list is *not* spread into positional arguments: ``[2, 3]`` calls ``add([2, 3])``;
      enqueue ``{"x": 2, "y": 3}`` to call ``add(x=2, y=3)``.
    * task id: ``message.idempotency_key``, so a re-published message has the same id.
    * queue: the outbox queue, passed to Celery as is; the outbox's own ``"default"`` queue (what
      a message gets when nobody chose one) is left to Celery's routing (``task_routes``, then
      ``task_default_queue``, which is ``"celery"`` unless configured). ``queue_map`` changes this.
    * ``eta``: ``run_at`` when it is still in the future by the relay's clock. The relay never
      publishes a row before its ``run_at`` by the database's clock; the ``eta`` keeps a worker
      whose clock is behind from running it early.
    * headers (``self.request.<name>`` in a bound task, and ``self.request.headers``): every
      field but ``job``, ``input`` and ``ordering_key`` (not sent), as
      :meth:`~sqla_outbox.OutboxMessage.to_dict` names and spells it, with ``id`` and ``queue``
      renamed: ``outbox_id``, ``outbox_queue``, ``idempotency_key``, ``max_attempts``,
      ``run_at`` and ``staged_at`` (ISO 8601), ``tenant_id``, ``traceparent``, ``enqueued_by``.
      None of them is a name Celery's protocol uses, so none overrides Celery's own.

Guarantees
    * Confirmed before marked. ``send_task`` returns after the transport handed the message to
      the broker: on Redis, after Redis replied to the ``LPUSH``; on AMQP (RabbitMQ), after the
      broker's publisher confirm, which this publisher turns on for its own connection
      (``confirm_publish``; ``confirm=False`` turns it off, and then a message the broker drops
      is lost without an error). A broker ``nack`` raises, and the row stays unpublished.
    * Bounded failure. The publisher sends with ``retry=True`` and its own bounded retry policy
      (3 retries, 0 s / 0.2 s / 0.4 s apart by default), not the app's
      ``task_publish_retry_policy``, which may be unbounded. A broker that refuses connections
      fails the pass in well under a second; a broker that accepts and then hangs fails it after
      ``socket_timeout`` (Redis) or ``confirm_timeout`` (AMQP) per attempt. The relay records the
      error and retries on a later pass.
    * Reconnection. The publisher opens one broker connection of its own, from the app's
      configuration (``app.connection_for_write()``: URL, SSL, failover, transport options), on
      the first publish. Kombu reconnects it within a publish; after a publish that still fails
      the publisher drops it, and the next pass opens a fresh one.
    * Order. Messages are sent one after the other, in claim order; on Redis a pass is pipelined
      (one round trip per 100 messages) through kombu's ``Producer.batch()`` where the installed
      kombu has it, and a pipeline counts as confirmed only once Redis answered all of it.

Outage or message failure (:mod:`sqla_outbox.publishers.outages`)
    :class:`CeleryUnavailableError`, an outage, when the broker connection failed: kombu's
    ``OperationalError`` for a broker that refuses connections, times out (a confirm that does
    not come within ``confirm_timeout``, a Redis reply not within ``socket_timeout``) or drops
    the connection, once the retry policy is spent; an AMQP login or vhost the broker refuses,
    or a ``CONNECTION_FORCED`` from a broker shutting down; and a Redis that takes no writes at
    all (``OOM``, ``READONLY``, ``LOADING``, ...). ``publish_batch`` passes ``published=k``,
    the confirmed prefix (0 when a Redis pipeline failed: any part of it may have gone out).
    Everything about *this* message is a message failure: a nack (kombu wraps it in an
    ``OperationalError`` too, with ``MessageNacked`` as its cause), an AMQP channel error (no
    such exchange, no access, too large), a Redis key of the wrong type, ``QueueNotFound`` from
    Celery's router, a value that does not serialize.

What it does not do
    * Celery does not deduplicate. A message can arrive twice (a relay killed between publish
      and mark, a broker timeout after the broker took the message), always with the same task id
      and ``idempotency_key``. Make the task idempotent, or record ``self.request.id`` in a
      table with a unique constraint in the same transaction as the task's effects.
    * Celery does not run tasks in publish order unless a single worker started with
      ``--pool solo`` consumes the queue: the publish order is kept, the execution order is the
      workers'.
    * It does not check the task name. A job no worker registered is published, and the worker
      drops it with "Received unregistered task" in its log.

The trap: the queue. A queue named at ``enqueue`` is sent to verbatim, and a queue no worker
consumes fills up silently; start workers with ``-Q`` for every outbox queue, or map the names
with ``queue_map``.

The broker connection belongs to the publisher, not to the app's pool, so that ``close()`` can
close it without breaking other code of the process that sends tasks through the same app.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from types import MappingProxyType
from typing import Any

from sqla_outbox.errors import (
    ArgumentTypeError,
    BrokerUnavailableError,
    PublisherError,
    PublishError,
)
from sqla_outbox.message import OutboxMessage, wire_fields
from sqla_outbox.publishers.celery_settings import (
    DEFAULT_RETRY_POLICY,
    EXAMPLE_URL,
    flag,
    number,
    resolve_queue_map,
    resolve_retry_policy,
    url_options,
)
from sqla_outbox.publishers.loader import import_module, resolve_attribute
from sqla_outbox.publishers.outages import causes, redis_unavailable
from sqla_outbox.publishers.urls import hide_password, require_client

try:
    # Celery and py-amqp (which kombu, Celery's transport layer, depends on) ship no type
    # information; their objects are typed Any here.
    import amqp.exceptions  # type: ignore[import-untyped]
    import kombu.exceptions
    from celery import Celery  # type: ignore[import-untyped]
    from celery.app.utils import find_app  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - exercised only without the extra
    Celery = None
    find_app = None

__all__ = [
    "CARRIED_ELSEWHERE",
    "DEFAULT_CONFIRM_TIMEOUT",
    "DEFAULT_RETRY_POLICY",
    "DEFAULT_SOCKET_TIMEOUT",
    "PIPELINE_SIZE",
    "CeleryPublisher",
    "CeleryUnavailableError",
    "broker_unavailable",
    "describe",
    "from_url",
    "task_arguments",
    "task_headers",
]

DEFAULT_CONFIRM_TIMEOUT = 10.0
"""Seconds to wait for an AMQP publisher confirm before the attempt counts as failed."""

DEFAULT_SOCKET_TIMEOUT = 10.0
"""Seconds a Redis read or connect may take, unless the app's transport options set their own.

Kombu's Redis transport waits for ever by default, so a Redis that accepts connections and then
hangs would stall the relay for good.
"""

PIPELINE_SIZE = 100
"""Messages per Redis pipeline: the unit that is confirmed, or published again, as a whole."""

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_TARGET = re.compile(rf"^(?P<module>{_DOTTED})(?::(?P<attribute>{_DOTTED}))?$")

# AMQP methods of class 10 are connection.*; (0, 0) is what a broker closing the connection
# outright (a refused login) reports. Any other class is a channel's: about one publish.
_CONNECTION_CLASSES = (0, 10)


class CeleryUnavailableError(BrokerUnavailableError):
    """Celery's broker cannot be reached or takes nothing: an outage, not a message failure.

    Raised with the kombu, py-amqp or redis-py error as its cause; see the module docs for which
    are outages. ``published`` is how many messages of the batch the broker confirmed first.
    """


def task_arguments(input: Any) -> tuple[list[Any], dict[str, Any]]:
    """``(args, kwargs)`` for the task: an object is keyword arguments, anything else one argument.

    ``None`` gives no arguments. A list is one positional argument, never spread: the outbox's
    ``input`` is one value, and a rule that spreads lists would break every task taking a list.
    """
    if input is None:
        return [], {}
    if isinstance(input, dict):
        return [], dict(input)
    return [input], {}


CARRIED_ELSEWHERE = MappingProxyType(
    {
        "job": "the task name",
        "input": "the task's arguments",
        # Celery routes by queue, not by a key, and runs tasks in the workers' order anyway; an
        # ordering key travels where the broker has a use for it (docs/brokers/writing.md).
        "ordering_key": "not sent",
    }
)
"""The fields that travel outside the headers, and where; every other field is a header.

``idempotency_key`` is also the task id, and ``run_at`` the ``eta`` while it is in the future."""

# Renamed so as not to be read as Celery's own: ``id`` is the task id in Celery's protocol, and
# the Celery queue may differ from the outbox's (``queue_map``).
_RENAMED = {"id": "outbox_id", "queue": "outbox_queue"}
WIRE_FIELDS = wire_fields(
    lambda name: _RENAMED.get(name, name), text=False, elsewhere=CARRIED_ELSEWHERE
)


def task_headers(message: OutboxMessage) -> dict[str, Any]:
    """The headers a task sees as ``self.request.<name>``: each field under its own name
    (``outbox_id`` and ``outbox_queue`` for ``id`` and ``queue``), as ``to_dict`` spells it.

    Every key is always present (``None`` when unset), so a task can read
    ``self.request.tenant_id`` without ``getattr``. ``traceparent`` is where OpenTelemetry's
    Celery instrumentation looks for the parent span.
    """
    headers: dict[str, Any] = {}
    for name, position, spell, _optional in WIRE_FIELDS:
        value = message[position]
        headers[name] = value if spell is None or value is None else spell(value)
    return headers


def describe(error: BaseException) -> str:
    """``Type: message``, followed by the causes kombu wrapped it around.

    Kombu re-raises transport errors as its own ``OperationalError``, often with an empty message
    (a broker's ``nack`` becomes ``OperationalError('')``); the cause is what an operator needs to
    read in ``last_error``.
    """
    parts: list[str] = []
    shown = ""
    current: BaseException | None = error
    while current is not None and len(parts) < 4:
        text = str(current)
        # A cause with the same text as its wrapper adds only its type.
        parts.append(
            f"{type(current).__name__}: {text}"
            if text and text != shown
            else type(current).__name__
        )
        shown = text or shown
        # Explicit causes (``raise ... from``) only, unless this error says nothing itself: an
        # implicit context is usually an internal detail (redis-py's empty-pool IndexError).
        current = current.__cause__ or (None if text else current.__context__)
    return " <- ".join(parts)


def broker_unavailable(error: BaseException) -> bool:
    """Whether ``error``, raised by ``send_task``, says the broker could not be used at all.

    kombu re-raises both connection and channel errors as ``OperationalError`` (a nack too), so
    the verdict is the first error down the chain of causes that says which it was; an
    ``OperationalError`` with nothing recognisable beneath it is kombu's "connection error".
    """
    kombu_connection_error = False
    for current in causes(error):
        if isinstance(current, amqp.exceptions.MessageNacked):
            return False
        if isinstance(current, amqp.exceptions.ConnectionError):
            return True
        if isinstance(current, amqp.exceptions.AMQPError):
            # A refused login arrives as AccessRefused, a channel error class, but from the
            # connection: the method it names tells the two apart.
            method = getattr(current, "method_sig", None) or (None,)
            return method[0] in _CONNECTION_CLASSES
        redis = redis_unavailable(current)
        if redis is not None:
            return redis
        if isinstance(current, (OSError, TimeoutError)):
            return True
        kombu_connection_error |= isinstance(current, kombu.exceptions.OperationalError)
    return kombu_connection_error


@contextmanager
def _enqueuer_trace(traceparent: str | None) -> Iterator[None]:
    # OpenTelemetry's Celery instrumentation, when the relay process has it, starts a "publish"
    # span in before_task_publish and overwrites the traceparent header with it. Making the
    # enqueuer's span current first puts that publish span, and the task's span, in the trace of
    # the request that enqueued the job instead of a new trace rooted in the relay.
    if traceparent is None or "opentelemetry.context" not in sys.modules:
        yield
        return
    from opentelemetry import context  # noqa: PLC0415 - optional, and already imported
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    token = context.attach(TraceContextTextMapPropagator().extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        context.detach(token)


class CeleryPublisher:
    """Sends each message as a Celery task through ``app``; see the module docs for the mapping.

    :param app: the ``celery.Celery`` app whose broker configuration to use. Its tasks need not
        be importable here: tasks are sent by name.
    :param queue_map: outbox queue name -> Celery queue name, or ``None`` for Celery's routing
        (``task_routes``, then ``task_default_queue``). Unmapped names are used as they are;
        the outbox's ``"default"`` queue maps to ``None`` unless this says otherwise.
    :param retry_policy: kombu's ``max_retries``, ``interval_start``, ``interval_step`` and
        ``interval_max`` for one publish; missing keys take :data:`DEFAULT_RETRY_POLICY`.
        ``max_retries`` must be a number: the relay, not the publisher, retries for ever.
    :param confirm: turn AMQP publisher confirms on for this publisher's connection (the app's
        other connections are untouched). ``False`` publishes unconfirmed, which can lose
        messages. Other transports ignore it.
    :param confirm_timeout: seconds to wait for an AMQP confirm per attempt.
    :param socket_timeout: Redis socket (read and connect) timeout for this publisher's
        connection; ``None`` keeps the app's ``broker_transport_options`` value, or
        :data:`DEFAULT_SOCKET_TIMEOUT` if it sets none. Other transports ignore it.
    :param pipeline: pipeline a pass on transports that can (Redis, with kombu 5.7 or later).
    """

    def __init__(
        self,
        app: Any,
        *,
        queue_map: Mapping[str, str | None] | None = None,
        retry_policy: Mapping[str, float] | None = None,
        confirm: bool = True,
        confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT,
        socket_timeout: float | None = None,
        pipeline: bool = True,
    ) -> None:
        require_client(Celery is not None, "CeleryPublisher", "celery")
        if not isinstance(app, Celery):
            raise ArgumentTypeError(
                f"CeleryPublisher needs a celery.Celery app, got {app!r}. Pass the app your "
                "workers use, e.g. CeleryPublisher(app) with app = Celery('myapp', broker=...)."
            )
        self.app = app
        self.queue_map = resolve_queue_map(queue_map)
        self.retry_policy = resolve_retry_policy(retry_policy)
        self.confirm = flag("confirm", confirm)
        self.confirm_timeout = number("confirm_timeout", confirm_timeout)
        self.socket_timeout = (
            None if socket_timeout is None else number("socket_timeout", socket_timeout)
        )
        self.pipeline = flag("pipeline", pipeline)
        # One pass at a time per publisher: a kombu connection is not thread-safe, and two
        # relays may share a publisher.
        self._lock = threading.Lock()
        self._connection: Any = None
        self._producer: Any = None

    def __repr__(self) -> str:
        return f"<CeleryPublisher app={self.app.main!r}>"

    # -- publishing -------------------------------------------------------------------------

    def publish(self, message: OutboxMessage) -> None:
        """Send one task; return once the broker has it, raise (not published) otherwise.

        A broker that cannot be used raises :class:`CeleryUnavailableError`; a message it
        refused raises kombu's or Celery's own error as it is.
        """
        with self._lock:
            _sent, failure = self._send_each(self._open(), [message])
            if failure is not None:
                broker = self._broker()
                self._drop_connection()
                if broker_unavailable(failure):
                    raise CeleryUnavailableError(
                        self._unavailable(broker, message, 0, 1, failure)
                    ) from failure
                raise failure

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        """Send ``messages`` in order; after a failure raise ``PublishError(published=k)``.

        ``k`` counts only messages the broker confirmed: a Redis pipeline that failed while it
        ran counts as none of its messages (they are sent again; consumers deduplicate).
        """
        with self._lock:
            confirmed = 0
            for start in range(0, len(messages), PIPELINE_SIZE):
                chunk = messages[start : start + PIPELINE_SIZE]
                failure: Exception | None
                try:
                    producer = self._open()
                except Exception as error:
                    sent, failure = 0, error
                else:
                    sent, failure = self._send_chunk(producer, chunk)
                confirmed += sent
                if failure is not None:
                    broker = self._broker()
                    self._drop_connection()
                    failed = messages[confirmed]
                    if broker_unavailable(failure):
                        raise CeleryUnavailableError(
                            self._unavailable(broker, failed, confirmed, len(messages), failure),
                            published=confirmed,
                        ) from failure
                    raise PublishError(
                        f"Celery took {confirmed} of {len(messages)} messages; sending job "
                        f"{failed.job!r} (outbox id {failed.id}) failed with {describe(failure)}",
                        published=confirmed,
                    ) from failure

    def _unavailable(
        self, broker: str, failed: OutboxMessage, confirmed: int, total: int, error: Exception
    ) -> str:
        return (
            f"Celery's broker {broker} could not be used: it took {confirmed} of {total} "
            f"messages, then sending job {failed.job!r} (outbox id {failed.id}) failed with "
            f"{describe(error).rstrip('.')}. Nothing is wrong with the message: check that the "
            "broker is running and that the app's broker URL (host, credentials, vhost) is "
            "right, and the relay retries on a later pass."
        )

    def _broker(self) -> str:
        """The broker's URL as errors show it (password hidden), else the app's name."""
        if self._connection is not None:
            # kombu's own as_uri() shows "**" even where there is no password.
            with suppress(Exception):  # a half-built connection: the app's name says enough
                return repr(hide_password(self._connection.as_uri(include_password=True)))
        return f"of app {self.app.main!r}"

    def _send_chunk(
        self, producer: Any, chunk: Sequence[OutboxMessage]
    ) -> tuple[int, Exception | None]:
        batch = getattr(producer, "batch", None)  # kombu >= 5.7
        if not (self.pipeline and batch is not None and producer.supports_batch_publish):
            return self._send_each(producer, chunk)
        sent, failure = 0, None
        try:
            # Leaving the block without an exception flushes the pipeline: the prefix before a
            # failed message still goes out, and is confirmed, in order. max_size counts Redis
            # commands (a queue with an expiry adds one per priority level), and is set high
            # enough that kombu never flushes part of a chunk on its own.
            with batch(max_size=PIPELINE_SIZE * 16):
                sent, failure = self._send_each(producer, chunk)
        except Exception as error:
            # The pipeline failed while Redis ran it, so any part of it may have gone out: none
            # of it counts as confirmed.
            return 0, failure or error
        return sent, failure

    def _send_each(
        self, producer: Any, messages: Sequence[OutboxMessage]
    ) -> tuple[int, Exception | None]:
        for sent, message in enumerate(messages):
            try:
                self._send(producer, message)
            except Exception as error:
                return sent, error
        return len(messages), None

    def _send(self, producer: Any, message: OutboxMessage) -> None:
        args, kwargs = task_arguments(message.input)
        options: dict[str, Any] = {}
        queue = self.queue_map.get(message.queue, message.queue)
        if queue is not None:
            options["queue"] = queue
        if message.run_at > dt.datetime.now(dt.timezone.utc):
            options["eta"] = message.run_at
        with _enqueuer_trace(message.traceparent):
            self.app.send_task(
                message.job,
                args=args,
                kwargs=kwargs,
                task_id=message.idempotency_key,
                headers=task_headers(message),
                producer=producer,
                retry=True,
                retry_policy=dict(self.retry_policy),
                confirm_timeout=self.confirm_timeout,
                # A relay run inside a Celery task must not attach every task it sends to that
                # task's results.
                add_to_parent=False,
                **options,
            )

    # -- the connection ---------------------------------------------------------------------

    def _open(self) -> Any:
        if self._producer is None:
            connection = self.app.connection_for_write()
            overrides = self._transport_overrides(connection)
            if overrides:
                connection.release()
                connection = self.app.connection_for_write(transport_options=overrides)
            self._connection = connection
            # Lazy: nothing connects until the first send, which kombu's retry policy covers.
            self._producer = self.app.amqp.Producer(connection)
        return self._producer

    def _transport_overrides(self, connection: Any) -> dict[str, Any]:
        driver = connection.transport.driver_type
        options = connection.transport_options or {}
        if driver == "amqp":
            return {"confirm_publish": self.confirm}
        if driver == "redis":
            names = ("socket_timeout", "socket_connect_timeout")
            if self.socket_timeout is not None:
                return dict.fromkeys(names, self.socket_timeout)
            return {name: DEFAULT_SOCKET_TIMEOUT for name in names if options.get(name) is None}
        return {}

    def _drop_connection(self) -> None:
        producer, connection = self._producer, self._connection
        self._producer = self._connection = None
        # Closing a connection that just failed can fail again; it is being thrown away.
        if producer is not None:
            with suppress(Exception):
                producer.release()
        if connection is not None:
            with suppress(Exception):
                connection.release()

    def close(self) -> None:
        """Close this publisher's broker connection; a later publish opens a new one.

        The app, its connection pool and its result backend are the application's and stay open.
        """
        with self._lock:
            self._drop_connection()


# -- from_url -------------------------------------------------------------------------------


def _load_app(url: str, module_name: str, attribute: str | None) -> Any:
    source = f"publisher {url!r}"
    module = import_module(module_name, source)
    if attribute is None:
        # Celery's own convention (``celery -A myapp``): the module's ``app`` or ``celery``
        # attribute, its ``celery`` submodule, or the one Celery instance it defines.
        try:
            return find_app(module_name)
        except Exception as error:
            raise PublisherError(
                f"Module {module_name!r} named by publisher {url!r} has no Celery app (no 'app' "
                f"or 'celery' attribute, no Celery instance); name it, e.g. "
                f"celery:{module_name}:app."
            ) from error
    # Explicit ``module:attribute`` is resolved here rather than by find_app, whose error for a
    # missing attribute is a misleading "No module named 'module:attribute'".
    fix = f"name the Celery app it defines, e.g. celery:{module_name}:app"
    return resolve_attribute(module, module_name, attribute, source, fix)


def from_url(url: str) -> CeleryPublisher:
    """The publisher for ``celery:<module>[:<attribute>][?option=value&...]``.

    ``<module>:<attribute>`` names a ``celery.Celery`` app (``celery:myapp.worker:app``); a bare
    ``<module>`` finds the app the way ``celery -A <module>`` does. Options (all optional):
    ``max_retries``, ``interval_start``, ``interval_step``, ``interval_max`` (the retry policy of
    one publish), ``confirm``, ``confirm_timeout``, ``socket_timeout`` and ``pipeline``; see
    :class:`CeleryPublisher`. Every problem raises :class:`PublisherError` with the fix.
    """
    if not isinstance(url, str):
        raise PublisherError(f"A Celery publisher URL must be a string, got {url!r}.")
    scheme, colon, rest = url.strip().partition(":")
    if scheme.lower() != "celery" or not colon:
        raise PublisherError(
            f"Publisher {url!r} is not a Celery URL; write celery:<module>:<attribute>, "
            f"e.g. {EXAMPLE_URL}."
        )
    target, _question, query = rest.partition("?")
    match = _TARGET.match(target)
    if match is None:
        raise PublisherError(
            f"Publisher {url!r} does not name a Celery app as <module>:<attribute> with dotted "
            f"Python names; write e.g. {EXAMPLE_URL} (no // after celery:)."
        )
    options = url_options(url, query)
    require_client(Celery is not None, f"Publisher {url!r}", "celery")
    app = _load_app(url, match["module"], match["attribute"])
    if not isinstance(app, Celery):
        raise PublisherError(
            f"Publisher {url!r} names {app!r}, which is not a celery.Celery app; point it at "
            f"the app your workers use, e.g. {EXAMPLE_URL}."
        )
    return CeleryPublisher(app, **options)
