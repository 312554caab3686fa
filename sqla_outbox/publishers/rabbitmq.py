"""RabbitMQ publisher: each message as a persistent AMQP 0-9-1 message, confirmed by the broker.

``sqla-outbox relay --publisher 'amqp://user:pass@host:5672/vhost?exchange=jobs'`` (or
``amqps://`` for TLS) builds a :class:`RabbitMQPublisher` through :func:`from_url`. It speaks
AMQP 0-9-1 through pika's ``BlockingConnection``; RabbitMQ is the broker it is tested against.

What it guarantees
    A message counts as published only once RabbitMQ has *confirmed* it (publisher confirms,
    ``confirm_delivery()``): the broker has taken responsibility for it, which for a persistent
    message on a durable or quorum queue means written to disk (or to a quorum). Every message
    is persistent (``delivery_mode=2``) and published with ``mandatory=True``, so a message no
    queue would receive is returned by the broker and reported as a failure, never silently
    dropped. Messages are published one at a time, each waiting for its confirm, so they enter
    the queue in claim order; a failure stops the pass at that message (``publish_batch`` raises
    :class:`~sqla_outbox.PublishError` with the confirmed prefix).

Where a message goes
    To the exchange named by ``?exchange=`` (default: the AMQP default exchange ``""``) with the
    message's ``queue`` as routing key. On the default exchange the routing key *is* the queue
    name, so a message enqueued with ``queue="emails"`` lands in the RabbitMQ queue ``emails``.

What a consumer receives
    The body is the job's ``input`` as UTF-8 JSON (``content_type="application/json"``), so a
    consumer reads its arguments with ``json.loads(body)``. The envelope travels in AMQP
    properties: ``message_id`` is the idempotency key, ``type`` the job name, ``timestamp`` the
    staging time (whole seconds), ``app_id`` ``"sqla-outbox"``; ``headers`` hold every field but
    ``input`` as :meth:`~sqla_outbox.OutboxMessage.to_dict` names and spells it (``id``, ``job``,
    ``queue``, ``idempotency_key``, ``max_attempts``, ``run_at``, ``staged_at``, and
    ``tenant_id``, ``traceparent``, ``enqueued_by``, ``ordering_key`` when set), so
    ``{**properties.headers, "input": json.loads(body)}`` is the message as staged.
    ``traceparent`` is the W3C header OpenTelemetry's AMQP propagators read.

What it does not do
    It does not declare queues, exchanges or bindings: topology belongs to the consumers, and a
    publisher declaring a queue with other arguments than the consumer's (classic versus quorum,
    a dead-letter exchange) makes RabbitMQ refuse one of them. Declare them before relaying.
    It does not deduplicate: delivery is at least once (a relay that dies between the confirm
    and marking the row publishes the row again), so consumers deduplicate on ``message_id``.
    RabbitMQ itself does not deduplicate on ``message_id`` either.

The traps
    * ``delivery_mode=2`` survives a broker restart only on a *durable* (or quorum) queue; on a
      transient queue the broker confirms the message and then loses it when it restarts.
    * A message for a queue that does not exist fails with "unroutable" (that is
      ``mandatory=True`` doing its job): the rows stay in the outbox until the queue is declared.
    * With ``BlockingConnection`` heartbeats are only answered while the publisher is in a call.
      A relay that idles longer than two heartbeat intervals finds its connection closed by the
      broker; the publisher notices that before sending anything and reconnects at once, so
      idling costs a reconnect, not a failed pass.
    * While RabbitMQ blocks publishers (memory or disk alarm) a publish waits; after
      ``blocked_connection_timeout`` seconds (60 unless the URL says otherwise) the connection is
      torn down and the pass fails, instead of holding the relay (and its ``stop()``) forever.
    * A confirm that never comes (a quorum queue that lost its majority) blocks the pass with no
      timeout of its own; the relay's claim lease then lets another relay take the rows over.

Connections: one connection and one confirm-mode channel per publisher, opened on the first
publish. Any connection or channel error (broker restart, ``CONNECTION_FORCED``, a channel closed
by the broker, a lost socket) drops them and is raised, so the relay records the failure; the
next publish connects again. :meth:`RabbitMQPublisher.close` (called by the relay when it stops)
closes the connection.

Outage or message failure (:mod:`sqla_outbox.publishers.outages`): every *connection*-level
failure is an outage, :class:`RabbitMQUnavailableError`: the broker cannot be reached, refuses
the login or the vhost (nothing could be published with that URL, whatever the message), closes
the connection (``CONNECTION_FORCED`` on a restart, missed heartbeats, a lost socket), or keeps
it blocked by a memory or disk alarm past ``blocked_connection_timeout``. ``publish_batch``
passes ``published=k`` when the connection went after *k* confirms. Everything RabbitMQ says
about *this* message or its destination is a message failure, :class:`RabbitMQError`: returned
as unroutable, nacked (a full queue with ``overflow=reject-publish``), or its channel closed
(``404`` no such exchange, ``403`` no write access, ``406`` e.g. larger than
``max_message_size``), and so is a message pika cannot encode.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from sqla_outbox.errors import BrokerError, BrokerUnavailableError, PublisherError, PublishError
from sqla_outbox.logs import log_event
from sqla_outbox.message import OutboxMessage, compact_json, spelled, wire_fields
from sqla_outbox.publishers.urls import hide_password, require_client, split_options, split_url

try:
    import pika  # type: ignore[import-untyped]
    import pika.exceptions  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - exercised only without the extra installed
    pika = None

__all__ = [
    "CARRIED_ELSEWHERE",
    "DEFAULT_BLOCKED_CONNECTION_TIMEOUT",
    "DEFAULT_URL",
    "RabbitMQError",
    "RabbitMQPublisher",
    "RabbitMQUnavailableError",
    "from_url",
]

log = logging.getLogger("sqla_outbox.publishers.rabbitmq")

DEFAULT_URL = "amqp://guest:guest@localhost:5672/%2F"
"""RabbitMQ's out-of-the-box address and account, the default of :class:`RabbitMQPublisher`."""

DEFAULT_BLOCKED_CONNECTION_TIMEOUT = 60.0
"""Seconds a publish may wait on a connection RabbitMQ has blocked (resource alarm).

pika's own default is to wait forever, which would hold the relay's pass, and ``stop()`` with
it, for as long as the alarm lasts. The URL option ``blocked_connection_timeout`` overrides it.
"""

APP_ID = "sqla-outbox"
"""The ``app_id`` property of every message, so a consumer can tell who produced it."""

_OWN_OPTIONS = frozenset({"exchange"})

CARRIED_ELSEWHERE = MappingProxyType({"input": "the body"})
"""The fields that travel outside the headers, and where; every other field is a header.

Three are also in properties, where AMQP tools look for them: ``message_id`` is the idempotency
key, ``type`` the job, ``timestamp`` the staging time in whole seconds."""

# Each field under its own name, as to_dict() spells it (max_attempts an AMQP integer). None
# values are left out rather than sent as AMQP "void": some client libraries cannot decode void
# table values.
WIRE_FIELDS = wire_fields(lambda name: name, text=False, elsewhere=CARRIED_ELSEWHERE)

if pika is not None:
    # The connection, not the message: lost, closed by the broker, or a channel that is gone
    # without the broker having said anything about a publish on it.
    _CONNECTION_LOST: tuple[type[BaseException], ...] = (
        pika.exceptions.AMQPConnectionError,
        pika.exceptions.ChannelWrongStateError,
        pika.exceptions.ChannelClosedByClient,
        OSError,
    )


class RabbitMQError(BrokerError):
    """RabbitMQ did not take a message: unroutable, refused, or the connection failed.

    The relay records the message as this error's sentence in the row's ``last_error``, so each
    one names the message, what RabbitMQ said, and what to do about it.
    """


class RabbitMQUnavailableError(RabbitMQError, BrokerUnavailableError):
    """RabbitMQ cannot be reached or used at all: an outage, not a message failure.

    Raised for a connection that cannot be opened (down, refused login or vhost) or that was
    lost or blocked while publishing. Still a :class:`RabbitMQError`, so code catching that
    catches this too. ``published`` is how many messages of the batch were confirmed first.
    """


def from_url(url: str) -> RabbitMQPublisher:
    """The publisher for an ``amqp://`` or ``amqps://`` URL (the CLI's ``--publisher``).

    Nothing connects yet: the first publish does, so a relay starts even while RabbitMQ is down.
    Raises :class:`~sqla_outbox.PublisherError` for a malformed URL, a bad option, or pika not
    being installed.
    """
    return RabbitMQPublisher(url)


class RabbitMQPublisher:
    """Publishes each message to RabbitMQ and returns once the broker has confirmed it.

    :param url: ``amqp[s]://user:password@host:port/vhost?options`` (vhost percent-encoded:
        ``%2F`` for ``/``). Options: ``exchange`` (the exchange to publish to; default the
        AMQP default exchange ``""``), plus pika's own connection options ``heartbeat``,
        ``blocked_connection_timeout``, ``socket_timeout``, ``stack_timeout``,
        ``connection_attempts``, ``retry_delay``, ``channel_max``, ``frame_max``, ``locale``,
        ``client_properties``, ``ssl_options``, ``tcp_options``.
    :param exchange: overrides the URL's ``exchange`` option when given.

    The URL is parsed and checked here, so a typo fails at start-up rather than on the first
    message; the connection itself opens on the first publish. See the module docs.
    """

    overlap = True
    """Relays claim ahead while this publisher works (:mod:`sqla_outbox.overlap`): with this
    broker it pays, the database being idle while the broker works; the ``brokers`` benchmark's
    "overlap flipped" row checks this default."""

    def __init__(self, url: str = DEFAULT_URL, *, exchange: str | None = None) -> None:
        require_client(pika is not None, "The RabbitMQ publisher", "amqp")
        options, pika_url = _split_url(url)
        self.exchange = options.get("exchange", "") if exchange is None else exchange
        if not isinstance(self.exchange, str):
            raise PublisherError(
                f"exchange must be a string naming a RabbitMQ exchange, got {self.exchange!r}; "
                "pass e.g. exchange='jobs', or '' for the default exchange."
            )
        self.url = hide_password(url)
        """The URL with its password replaced by ``***``, for logs and errors."""
        self._parameters = _connection_parameters(pika_url, self.url)
        self._connection: Any = None
        self._channel: Any = None
        # pika connections are not thread-safe; one publisher shared by two relays in a process
        # must not interleave frames on the one channel.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<RabbitMQPublisher {self.url} exchange={self.exchange!r}>"

    def publish(self, message: OutboxMessage) -> None:
        """Publish ``message`` and wait for RabbitMQ's confirm; raise if it was not confirmed."""
        with self._lock:
            self._publish_one(message)

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        """Publish ``messages`` in order, each confirmed before the next is sent.

        pika's ``BlockingChannel`` confirms one message per ``basic_publish``, so the batch is a
        loop; sending one at a time also keeps a returned (unroutable) message from being
        overtaken by the ones behind it. At the first failure this raises with ``published`` =
        the confirmed prefix: :class:`RabbitMQUnavailableError` when the connection failed,
        :class:`~sqla_outbox.PublishError` when RabbitMQ refused that message.

        What the broker sent while the publisher idled is read once, before the first message:
        each later one follows a confirm received a moment ago on the same connection, and a
        close arriving in between fails its send as an outage (with the confirmed prefix).
        Reading before every message would add that read to every publish, where the confirm
        just received already shows the connection alive.
        """
        with self._lock:
            for confirmed, message in enumerate(messages):
                try:
                    self._publish_one(message, fresh=confirmed == 0)
                except Exception as error:
                    text = (
                        f"{error} (RabbitMQ had confirmed {confirmed} of the {len(messages)} "
                        "messages of this pass before it.)"
                    )
                    if isinstance(error, RabbitMQUnavailableError):
                        raise RabbitMQUnavailableError(text, published=confirmed) from error
                    raise PublishError(text, published=confirmed) from error

    def close(self) -> None:
        """Close the connection, if one is open; the next publish would open a new one."""
        with self._lock:
            self._drop()

    def __enter__(self) -> RabbitMQPublisher:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _publish_one(self, message: OutboxMessage, *, fresh: bool = True) -> None:
        # Not fresh: the batch's previous message was just confirmed on this very channel.
        channel = self._open_channel() if fresh else self._channel
        try:
            channel.basic_publish(
                exchange=self.exchange,
                routing_key=message.queue,
                body=_body(message),
                properties=_properties(message),
                mandatory=True,
            )
        except pika.exceptions.UnroutableError as error:
            # The broker returned the message, then confirmed it: the channel is still fine.
            raise RabbitMQError(self._unroutable(message)) from error
        except pika.exceptions.NackError as error:
            raise RabbitMQError(
                f"RabbitMQ refused (nacked) message {message.id} for routing key "
                f"{message.queue!r} on exchange {self.exchange!r}, which it does for a queue "
                "at its x-max-length with overflow=reject-publish or on an internal error; "
                "make room in the queue or check the broker's log, and the next pass retries."
            ) from error
        except pika.exceptions.ChannelClosedByBroker as error:
            self._drop()
            raise RabbitMQError(self._channel_closed(message, error)) from error
        except pika.exceptions.ConnectionBlockedTimeout as error:
            self._drop()
            raise RabbitMQUnavailableError(
                f"RabbitMQ at {self.url} blocked publishing for longer than "
                f"blocked_connection_timeout while message {message.id} was being sent, which it "
                "does during a memory or disk alarm; it was not confirmed, so free memory or disk "
                "on the broker (rabbitmqctl status shows the alarm) and the relay retries."
            ) from error
        except _CONNECTION_LOST as error:
            self._drop()
            raise RabbitMQUnavailableError(
                f"Lost the connection to RabbitMQ at {self.url} while publishing message "
                f"{message.id} ({_describe(error)}); it was not confirmed, and the next pass "
                "reconnects and publishes it again."
            ) from error
        except pika.exceptions.AMQPError as error:
            # What is left is this message's own: a property pika cannot encode (a job name
            # over 255 bytes in ``type``, a header value of an unsupported type).
            self._drop()
            raise RabbitMQError(
                f"Message {message.id} (job {message.job!r}) cannot be sent as AMQP "
                f"({_describe(error)}); fix its job name or headers at enqueue, since RabbitMQ "
                "will never take it as it is."
            ) from error
        except BaseException:
            # Anything else (KeyboardInterrupt mid-frame, a bug) may leave half a message on
            # the wire; a fresh connection is the only safe state to continue from.
            self._drop()
            raise

    def _open_channel(self) -> Any:
        if self._connection is not None:
            try:
                # Read whatever the broker sent while we were idle: a CONNECTION_FORCED after a
                # restart, a close for missed heartbeats. Nothing has been sent for this message
                # yet, so replacing a dead connection here cannot reorder or duplicate anything.
                self._connection.process_data_events(time_limit=0)
                if self._channel is not None and self._channel.is_open:
                    return self._channel
            except Exception as error:
                log_event(
                    log,
                    logging.INFO,
                    "rabbitmq.reconnecting",
                    url=self.url,
                    reason=_describe(error),
                )
            self._drop()
        self._connect()
        return self._channel

    def _connect(self) -> None:
        try:
            connection = pika.BlockingConnection(self._parameters)
        except Exception as error:
            raise RabbitMQUnavailableError(
                f"Could not connect to RabbitMQ at {self.url} ({_describe(error)}); check that "
                "the broker is running and the URL's host, port, vhost and credentials, and the "
                "relay retries on its next pass."
            ) from error
        try:
            channel = connection.channel()
            channel.confirm_delivery()
        except Exception as error:
            _close_quietly(connection)
            raise RabbitMQUnavailableError(
                f"Connected to RabbitMQ at {self.url} but could not open a channel in confirm "
                f"mode ({_describe(error)}); check the broker's log, and the relay retries on "
                "its next pass."
            ) from error
        self._connection, self._channel = connection, channel

    def _drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            _close_quietly(connection)

    def _unroutable(self, message: OutboxMessage) -> str:
        if self.exchange == "":
            return (
                f"RabbitMQ returned message {message.id} (job {message.job!r}) as unroutable "
                f"because no queue named {message.queue!r} exists on the default exchange of "
                f"this vhost, so declare the queue {message.queue!r} (durable) before relaying."
            )
        return (
            f"RabbitMQ returned message {message.id} (job {message.job!r}) as unroutable because "
            f"exchange {self.exchange!r} has no binding for routing key {message.queue!r}, so "
            f"bind a queue to {self.exchange!r} with that routing key before relaying."
        )

    def _channel_closed(self, message: OutboxMessage, error: Any) -> str:
        where = (
            f"publishing message {message.id} to exchange {self.exchange!r} with routing key "
            f"{message.queue!r}"
        )
        said = f"{error.reply_code} {error.reply_text}"
        if error.reply_code == 404:  # NOT_FOUND: the exchange does not exist
            fix = (
                f"declare the exchange {self.exchange!r} or fix ?exchange= in the publisher "
                "URL, and the next pass retries"
            )
        elif error.reply_code == 403:  # ACCESS_REFUSED
            fix = "grant the URL's user write access to that exchange, and the next pass retries"
        else:
            fix = "the next pass reconnects and retries"
        return f"RabbitMQ closed the channel {where} ({said}); {fix}."


def _body(message: OutboxMessage) -> bytes:
    return compact_json(message.input).encode()


def _properties(message: OutboxMessage) -> Any:
    return pika.BasicProperties(
        content_type="application/json",
        delivery_mode=pika.DeliveryMode.Persistent,
        message_id=message.idempotency_key,
        type=message.job,
        timestamp=int(message.staged_at.timestamp()),
        app_id=APP_ID,
        headers=spelled(message, WIRE_FIELDS),
    )


def _split_url(url: str) -> tuple[dict[str, str], str]:
    """This module's own options, and the URL with them removed (what pika is given)."""
    if not isinstance(url, str):
        raise PublisherError(
            f"The RabbitMQ publisher needs an amqp:// or amqps:// URL string, got {url!r}."
        )
    parts, shown = split_url(
        url,
        label="RabbitMQ URL",
        example="amqp://user:password@host:5672/vhost, with the vhost percent-encoded (%2F for /)",
        schemes=("amqp", "amqps"),
    )
    if parts.path.count("/") > 1:
        raise PublisherError(
            f"RabbitMQ URL {shown!r} has the path {parts.path!r}, but the path is one vhost "
            "name; percent-encode any '/' in it (amqp://host/%2F is the vhost '/')."
        )
    return split_options(parts, _OWN_OPTIONS, label="RabbitMQ URL", shown=shown)


def _connection_parameters(pika_url: str, shown: str) -> Any:
    try:
        parameters = pika.URLParameters(pika_url)
    except Exception as error:
        raise PublisherError(
            f"RabbitMQ URL {shown!r} has a bad option ({error}); the options are exchange and "
            "pika's connection options (heartbeat, blocked_connection_timeout, socket_timeout, "
            "connection_attempts, ...), see the RabbitMQ page of the documentation."
        ) from error
    query = dict(parse_qsl(urlsplit(pika_url).query, keep_blank_values=True))
    if "blocked_connection_timeout" not in query:
        parameters.blocked_connection_timeout = DEFAULT_BLOCKED_CONNECTION_TIMEOUT
    if "client_properties" not in query:
        # Shown in the management UI and rabbitmqctl list_connections, so an operator can tell
        # the relay's connections from the application's.
        parameters.client_properties = {"connection_name": APP_ID}
    return parameters


def _describe(error: BaseException) -> str:
    # pika's connection errors often have an empty str() and carry the cause in args.
    text = str(error).strip() or ", ".join(str(arg) or repr(arg) for arg in error.args)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _close_quietly(connection: Any) -> None:
    try:
        if connection.is_open:
            connection.close()
    except Exception as error:  # already closed by the broker, or the socket is gone
        log.debug("closing a RabbitMQ connection failed: %s", _describe(error))
