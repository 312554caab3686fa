"""Kafka publisher: one record per outbox row, confirmed by the producer's delivery report.

``--publisher 'kafka://broker1:9092,broker2:9092?topic={queue}'``

What it guarantees
    A message counts as published only once its *delivery report* says the partition leader
    wrote it with ``acks=all`` (every in-sync replica has it). The producer is idempotent
    (``enable.idempotence=true``), so its own retries inside one pass never write a record twice
    or out of order. :meth:`KafkaPublisher.publish_batch` produces a whole pass, then waits once
    for the delivery reports (``flush``), and reports the confirmed prefix: if the third of ten
    is refused it raises ``PublishError(published=2)`` and the relay marks exactly two. The
    record key is the message's ``ordering_key``, so every message of a key lands in one
    partition, in staging order (Kafka orders a partition, not a topic).

What it writes
    To the topic named by the ``topic`` pattern (``{queue}`` replaced by the message's queue;
    default just ``{queue}``). Key: ``ordering_key`` as UTF-8, or no key (the partition is then
    the client's choice, and Kafka keeps no order between messages of different partitions).
    Value: the message's ``input`` as compact UTF-8 JSON. Headers (UTF-8 strings; absent when
    the field is ``None``): ``content-type`` (``application/json``), and every other field under
    its name with dashes for underscores: ``id``, ``job``, ``queue``, ``idempotency-key`` (what
    consumers deduplicate on), ``max-attempts``, ``run-at`` and ``staged-at`` (ISO 8601 with
    offset), ``tenant-id``, the W3C ``traceparent`` and ``enqueued-by``. Keys are hashed with
    ``murmur2`` like the Java client's, so a Java and a Python producer put one key in the same
    partition.

What it does not do
    It does not deduplicate across passes: delivery is at least once (a relay killed between the
    delivery report and its mark publishes the row again after the claim lease, under a new
    producer id the broker cannot match). Consumers deduplicate on the ``idempotency-key``
    header. It creates no topics itself; whether producing to a missing topic creates it is the
    broker's ``auto.create.topics.enable`` (and the URL's ``auto_create_topics``). It does not
    use Kafka transactions: the outbox row, committed with the application's data, is what ties
    a message to the database transaction, and a Kafka transaction cannot span the database.

Failure behaviour
    One ``confluent_kafka.Producer`` per publisher, built when the publisher is (a bad setting
    fails at start-up; the producer connects in the background, so a relay starts while Kafka is
    down). Every message has ``delivery_timeout`` seconds (librdkafka's ``message.timeout.ms``,
    10 s here instead of librdkafka's 300 s) to be confirmed, so an unreachable cluster fails a
    pass within that bound. After any failed delivery the producer is closed and a new one built
    for the next pass: an idempotent producer that saw a refusal must bump its epoch, and some
    brokers (Tansu) fence it for good instead.

Outage or message failure (:mod:`sqla_outbox.publishers.outages`)
    :class:`KafkaUnavailableError`, an outage: no broker reachable (connection refused, DNS,
    TLS, SASL authentication), a message that timed out (no broker confirmed it within
    ``delivery_timeout``), a transport error, a leader or enough in-sync replicas missing
    (``NOT_ENOUGH_REPLICAS``), a producer fenced or in a fatal state, the cluster refusing this
    producer's idempotent writes (``CLUSTER_AUTHORIZATION_FAILED``), and any other error the
    client calls retriable. ``published`` is the confirmed prefix. Every refusal of *this*
    message or its topic is a message failure, :class:`~sqla_outbox.PublishError`: larger than
    ``message_max_bytes`` (refused by the client before it is sent) or than the broker's limit
    (``MSG_SIZE_TOO_LARGE``), an invalid record (``INVALID_RECORD``, e.g. a broker-side schema),
    an unknown topic where topics are not auto-created (``UNKNOWN_TOPIC_OR_PART``), no write
    access to the topic (``TOPIC_AUTHORIZATION_FAILED``), or a key, value or header that cannot
    be encoded.

Order under partial failure
    A message the client refuses before it leaves (``produce()`` raises: too large, cannot be
    encoded) ends the pass there: nothing after it is produced, the messages before it are
    flushed, and their confirmed prefix is reported. A broker refuses a whole produce *batch*
    (all the pass's records for one partition, normally) when one record in it is invalid, so
    every record of that batch comes back failed; when more than one record of a partition came
    back with such a batch-wide refusal, the publisher sends the pass again one record at a
    time, on a new producer, from the first failed one (skipping records already confirmed in
    order), to find the record actually at fault, and blames that one. A pass whose records for
    one partition fill more than one batch (over ``batch.size``, 1 MB) can have a later batch
    written after an earlier one was refused: those records stand before the refused one in the
    partition. ``docs/brokers/kafka.md`` has the measurement.

The trap
    ``acks=all`` waits for the replicas that are *in sync*, and with the broker default
    ``min.insync.replicas=1`` that can be the leader alone: a leader lost right after confirming
    takes the record with it, and the outbox has already marked it published. Give topics a
    replication factor of 3 and ``min.insync.replicas=2``; a partition below that then refuses
    writes (``NOT_ENOUGH_REPLICAS``, an outage) instead of confirming what one disk holds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, cast

from sqla_outbox.errors import BrokerUnavailableError, PublisherError, PublishError
from sqla_outbox.logs import log_event
from sqla_outbox.message import OutboxMessage, compact_json, wire_fields
from sqla_outbox.publishers import kafka_url
from sqla_outbox.publishers.kafka_errors import (
    BATCH_REFUSALS,
    broker_fix,
    clean_text,
    describe,
    error_name,
    kafka_error_of,
    kafka_unavailable,
)
from sqla_outbox.publishers.kafka_url import (
    DEFAULT_DELIVERY_TIMEOUT,
    DEFAULT_PORT,
    QUEUE_PLACEHOLDER,
)
from sqla_outbox.publishers.urls import (
    positive_seconds,
    require_client,
)

try:
    import confluent_kafka
except ImportError:  # pragma: no cover - exercised only without the extra
    _CLIENT_INSTALLED = False
else:
    _CLIENT_INSTALLED = True

__all__ = [
    "CARRIED_ELSEWHERE",
    "DEFAULT_DELIVERY_TIMEOUT",
    "DEFAULT_PORT",
    "FIXED_SETTINGS",
    "KafkaPublisher",
    "KafkaUnavailableError",
    "from_url",
    "kafka_unavailable",
    "record_headers",
]

log = logging.getLogger("sqla_outbox.publishers.kafka")

FIXED_SETTINGS: Mapping[str, object] = {"enable.idempotence": True, "acks": "all"}
"""The producer settings that make a delivery report mean "stored, once, in order"; a
``config`` that contradicts them is refused."""

# Settings that belong to the publisher itself: they are how it learns of deliveries and errors,
# or they have a parameter of their own (delivery_timeout).
_RESERVED = frozenset(
    {
        "bootstrap.servers",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "on_delivery",
        "error_cb",
        "logger",
    }
)
_REPORT_GRACE = 5.0  # seconds past delivery_timeout before a missing report counts as lost
_QUEUE_FULL_POLL = 0.05  # seconds to serve delivery reports while the client's queue is full


class KafkaUnavailableError(BrokerUnavailableError):
    """No Kafka broker takes writes now, whatever the message: an outage, not a message failure.

    Unreachable, a message that timed out, a transport or authentication error, a partition
    without a leader or without enough in-sync replicas, a fenced or failed producer; see the
    module docs. ``published`` is how many messages of the batch were confirmed before that.
    """


def _require_client() -> None:
    require_client(_CLIENT_INSTALLED, "The Kafka publisher", "kafka")


CARRIED_ELSEWHERE = MappingProxyType(
    {"input": "the record's value", "ordering_key": "the record's key"}
)
"""The fields that travel outside the headers, and where; every other field is a header."""

# The header of each field: its name with dashes for underscores (``idempotency-key``), its
# text spelling in UTF-8.
WIRE_FIELDS = wire_fields(
    lambda name: name.replace("_", "-"), text=True, elsewhere=CARRIED_ELSEWHERE
)
_CONTENT_TYPE = ("content-type", b"application/json")


def record_headers(message: OutboxMessage) -> list[tuple[str, bytes]]:
    """The Kafka headers of ``message``'s record (see the module docs), UTF-8 encoded.

    Optional fields that are ``None`` are left out rather than sent empty, so a consumer can
    tell "no tenant" from a tenant named ``""``. Raises ``UnicodeEncodeError`` for text that is not
    valid Unicode (a lone surrogate), which the publisher reports as a message failure.
    """
    headers = [_CONTENT_TYPE]
    for name, position, spell, optional in WIRE_FIELDS:
        value: Any = message[position]
        if value is None and optional:
            continue
        headers.append((name, (value if spell is None else spell(value)).encode()))
    return headers


class _Pass:
    """The delivery reports of one produce-then-flush round, by position in the round."""

    def __init__(self, count: int) -> None:
        self.errors: list[Any] = [None] * count  # confluent_kafka.KafkaError or None
        self.partitions: list[int] = [-1] * count
        self.arrived = [False] * count

    def callback(self, index: int) -> Callable[[Any, Any], None]:
        def delivered(error: Any, record: Any) -> None:
            self.errors[index] = error
            self.partitions[index] = record.partition() if record is not None else -1
            self.arrived[index] = True

        return delivered


class KafkaPublisher:
    """Produces each message as a Kafka record and returns once its delivery report confirms it.

    :param bootstrap_servers: ``host:port[,host:port...]``, the brokers to learn the cluster
        from (the producer then talks to each partition's leader).
    :param topic: topic name pattern; ``{queue}`` becomes the message's queue. A pattern without
        ``{queue}`` sends every queue to one topic (the ``queue`` header tells them apart).
    :param delivery_timeout: seconds each message has to be confirmed; an unreachable cluster
        fails a pass within about this long.
    :param config: more librdkafka producer settings (``security.protocol``, ``sasl.*``,
        ``linger.ms``, ``compression.type``, ...). The idempotence and ``acks`` settings, the
        bootstrap servers and the timeout are the publisher's and cannot be changed here.
    :param shown: how messages name this publisher (from :func:`from_url`: its URL without the
        password). Default: the bootstrap servers.
    """

    overlap = True
    """Relays claim ahead while this publisher works (:mod:`sqla_outbox.overlap`): with this
    broker it pays, its confirmations leaving the database idle otherwise; the ``brokers``
    benchmark's "overlap flipped" row checks this default."""

    messaging_system = "kafka"
    """The OpenTelemetry ``messaging.system`` of this publisher's spans."""

    def __init__(
        self,
        bootstrap_servers: str = f"localhost:{DEFAULT_PORT}",
        *,
        topic: str = QUEUE_PLACEHOLDER,
        delivery_timeout: float = DEFAULT_DELIVERY_TIMEOUT,
        config: Mapping[str, object] | None = None,
        shown: str | None = None,
    ) -> None:
        _require_client()
        if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
            raise PublisherError(
                f"bootstrap_servers must be 'host:port[,host:port...]', got "
                f"{bootstrap_servers!r}; pass e.g. 'localhost:9092'."
            )
        self.bootstrap_servers = bootstrap_servers
        self.topic = _check_topic(topic)
        self.delivery_timeout = positive_seconds(
            "delivery_timeout", delivery_timeout, default=DEFAULT_DELIVERY_TIMEOUT
        )
        self._shown = shown if shown is not None else f"kafka://{bootstrap_servers}"
        self._config = self._producer_config(dict(config or {}))
        self._lock = threading.Lock()
        self._last_error: str | None = None  # the client's latest error, for outage messages
        self._logged_error: str | None = None
        self._producer: confluent_kafka.Producer | None = self._new_producer()

    def __repr__(self) -> str:
        return f"<KafkaPublisher to {self._shown} topic={self.topic!r}>"

    @property
    def client_settings(self) -> dict[str, object]:
        """The librdkafka settings the producer is built with, ``sasl.password`` as ``***``:
        what to compare with a broker's expectations when a connection is refused."""
        return {
            name: "***" if name == "sasl.password" else value
            for name, value in self._config.items()
        }

    def topic_for(self, message: OutboxMessage) -> str:
        """The topic ``message`` is produced to: the pattern with its queue filled in."""
        return self.topic.replace(QUEUE_PLACEHOLDER, message.queue)

    def publish(self, message: OutboxMessage) -> None:
        """Produce one message; return once its delivery report confirms it, else raise."""
        self.publish_batch([message])

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        """Produce ``messages`` in order, wait once for their delivery reports, raise on a gap.

        Returns when every message is confirmed. Otherwise raises with ``published`` = the
        confirmed prefix: :class:`KafkaUnavailableError` for an outage,
        :class:`~sqla_outbox.PublishError` for a message the client or the broker refused (see
        "Order under partial failure" in the module docs for what is sent after a refusal).
        """
        if not messages:
            return
        with self._lock:
            self._publish(list(messages))

    def close(self) -> None:
        """Close the producer; a later publish builds a new one. Nothing is pending between
        passes (each pass waits for its reports), so nothing is lost."""
        with self._lock:
            self._discard_producer()

    def __enter__(self) -> KafkaPublisher:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- one pass ---------------------------------------------------------------------------

    def _publish(self, messages: list[OutboxMessage]) -> None:
        topics = [self.topic_for(message) for message in messages]
        produced, refusal, reports = self._round(messages, topics)
        failed = next((i for i in range(produced) if _failed(reports, i)), None)
        if failed is None:
            if refusal is not None:
                raise self._refused(messages, topics, produced, refusal)
            return
        error, arrived = reports.errors[failed], reports.arrived[failed]
        self._discard_producer()  # see "Failure behaviour" in the module docs
        if not arrived or kafka_unavailable(error):
            raise self._unavailable(messages, topics, failed, error)
        if error_name(error) in BATCH_REFUSALS and _shared(reports, topics, failed):
            self._isolate(messages, topics, failed, reports, produced)
            return
        raise self._broker_refused(messages, topics, failed, error)

    def _round(
        self, messages: Sequence[OutboxMessage], topics: Sequence[str]
    ) -> tuple[int, BaseException | None, _Pass]:
        """Produce ``messages`` until the client refuses one, then wait for every report.

        Returns how many were produced, the client's refusal of the next one (or ``None``),
        and the reports. A client-side refusal stops the round so that nothing behind the
        refused message can reach the partition ahead of it.
        """
        producer = self._producer_now()
        producer.poll(0)  # serve what arrived between passes before judging this one
        self._last_error = None
        reports = _Pass(len(messages))
        deadline = time.monotonic() + self.delivery_timeout + _REPORT_GRACE
        produced = 0
        refusal: BaseException | None = None
        for index, (message, topic) in enumerate(zip(messages, topics, strict=True)):
            try:
                self._produce(producer, message, topic, reports.callback(index), deadline)
            except (confluent_kafka.KafkaException, TypeError, ValueError, BufferError) as error:
                refusal = error
                break
            produced += 1
        producer.flush(max(0.0, deadline - time.monotonic()))
        return produced, refusal, reports

    def _produce(
        self,
        producer: confluent_kafka.Producer,
        message: OutboxMessage,
        topic: str,
        callback: Callable[[Any, Any], None],
        deadline: float,
    ) -> None:
        key = message.ordering_key.encode("utf-8") if message.ordering_key is not None else None
        value = compact_json(message.input).encode("utf-8")
        headers = cast("list[tuple[str, str | bytes | None]]", record_headers(message))
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=callback, headers=headers)
                return
            except BufferError:
                # The client's queue is full: serving delivery reports makes room. Not a
                # refusal of this message, unless nothing drains before the deadline.
                if time.monotonic() >= deadline:
                    raise
                producer.poll(_QUEUE_FULL_POLL)

    def _isolate(
        self,
        messages: list[OutboxMessage],
        topics: list[str],
        start: int,
        first: _Pass,
        produced: int,
    ) -> None:
        """Send ``messages[start:]`` one at a time and blame the first that fails on its own;
        return if none does (the broker refused a batch, not a record).

        ``first`` holds the reports of the round that failed (``produced`` messages long). A
        message it confirmed is not sent again if nothing before it in its partition failed:
        it already stands in order. Every other one is sent again, after the ones before it.
        """
        disordered: set[tuple[str, int]] = set()  # partitions with a failure so far
        for index in range(start, len(messages)):
            where = (topics[index], first.partitions[index]) if index < produced else None
            if where is not None and _failed(first, index):
                disordered.add(where)
            elif where is not None and where not in disordered:
                continue  # confirmed in the first round, in order
            produced_now, refusal, reports = self._round(
                messages[index : index + 1], topics[index : index + 1]
            )
            if produced_now and not _failed(reports, 0):
                continue
            if refusal is not None:
                raise self._refused(messages, topics, index, refusal)
            error, arrived = reports.errors[0], reports.arrived[0]
            self._discard_producer()
            if not arrived or kafka_unavailable(error):
                raise self._unavailable(messages, topics, index, error)
            raise self._broker_refused(messages, topics, index, error, alone=True)

    # -- errors -----------------------------------------------------------------------------

    def _where(self, message: OutboxMessage, topic: str) -> str:
        return f"message {message.id} (job {message.job!r}) to topic {topic!r}"

    def _refused(
        self,
        messages: Sequence[OutboxMessage],
        topics: Sequence[str],
        index: int,
        error: BaseException,
    ) -> BrokerUnavailableError | PublishError:
        """The client refused ``messages[index]`` before sending it."""
        where = self._where(messages[index], topics[index])
        kafka_error = kafka_error_of(error)
        if isinstance(error, BufferError) or (
            kafka_error is not None and kafka_unavailable(kafka_error)
        ):
            self._discard_producer()
            return KafkaUnavailableError(
                f"Kafka at {self._shown} could not take {where}: {describe(error)}; "
                f"{_confirmed(index)} and the relay retries on a later pass.",
                published=index,
            )
        if kafka_error is not None and error_name(kafka_error) == "MSG_SIZE_TOO_LARGE":
            fix = "raise message_max_bytes (and the topic's max.message.bytes) or shrink the input"
        elif kafka_error is not None:
            fix = broker_fix(kafka_error, topics[index])
        elif isinstance(error, UnicodeError):
            fix = "replace the text in its fields that is not valid Unicode (a lone surrogate)"
        else:
            fix = "make its fields encodable (its input JSON-serialisable)"
        return PublishError(
            f"The Kafka client refused {where} before sending it: {describe(error)}; nothing "
            f"after it was produced, {_confirmed(index)}, and the fix is to {fix}.",
            published=index,
        )

    def _broker_refused(
        self,
        messages: Sequence[OutboxMessage],
        topics: Sequence[str],
        index: int,
        error: Any,
        *,
        alone: bool = False,
    ) -> PublishError:
        where = self._where(messages[index], topics[index])
        how = " sent on its own" if alone else ""
        return PublishError(
            f"Kafka at {self._shown} refused {where}{how}: {describe(error)}; "
            f"{_confirmed(index)}, and the fix is to {broker_fix(error, topics[index])}.",
            published=index,
        )

    def _unavailable(
        self,
        messages: Sequence[OutboxMessage],
        topics: Sequence[str],
        index: int,
        error: Any,
    ) -> KafkaUnavailableError:
        where = self._where(messages[index], topics[index])
        if error is None:
            reason = (
                f"no delivery report came within {self.delivery_timeout:g} s plus "
                f"{_REPORT_GRACE:g} s"
            )
        elif error_name(error) == "_MSG_TIMED_OUT":
            reason = f"no broker confirmed it within delivery_timeout={self.delivery_timeout:g} s"
        else:
            reason = describe(error)
        if self._last_error is not None and (error is None or self._last_error not in reason):
            reason += f" (last client error: {self._last_error})"
        return KafkaUnavailableError(
            f"Kafka at {self._shown} did not confirm {where}: {reason}; {_confirmed(index)} "
            "and the relay retries the rest on a later pass.",
            published=index,
        )

    # -- the producer -----------------------------------------------------------------------

    def _producer_config(self, extra: dict[str, object]) -> dict[str, object]:
        for name, value in extra.items():
            if name in _RESERVED:
                raise PublisherError(
                    f"config sets {name!r}, which the Kafka publisher manages itself; pass "
                    "bootstrap_servers or delivery_timeout instead, or drop it."
                )
            if name in FIXED_SETTINGS and str(value).lower() != str(FIXED_SETTINGS[name]).lower():
                raise PublisherError(
                    f"config sets {name}={value!r}, but the Kafka publisher needs "
                    f"{name}={FIXED_SETTINGS[name]!r} so that a delivery report means stored "
                    "once and in order; drop the setting."
                )
        timeout_ms = math.ceil(self.delivery_timeout * 1000)
        config: dict[str, object] = {
            "client.id": "sqla-outbox",
            "partitioner": "murmur2_random",  # the Java client's: one key, one partition
            "log.connection.close": False,  # brokers close idle connections; not news
            **extra,
            **FIXED_SETTINGS,
            "bootstrap.servers": self.bootstrap_servers,
            "message.timeout.ms": timeout_ms,
        }
        # librdkafka waits this long for a topic the broker says does not exist (it may be
        # being created) before failing its messages as UNKNOWN_TOPIC_OR_PART. Its 30 s default
        # outlasts delivery_timeout, which would turn "no such topic" into a timeout, an outage.
        config.setdefault("topic.metadata.propagation.max.ms", min(30_000, timeout_ms // 2))
        return config

    def _new_producer(self) -> confluent_kafka.Producer:
        settings = {**self._config, "error_cb": self._client_error, "logger": _ClientLog()}
        try:
            return confluent_kafka.Producer(settings)
        except (confluent_kafka.KafkaException, ValueError, TypeError) as error:
            raise PublisherError(
                f"The Kafka producer for {self._shown} cannot be built: {describe(error)}; "
                "check the URL options and config against the Kafka page of the documentation."
            ) from error

    def _producer_now(self) -> confluent_kafka.Producer:
        if self._producer is None:
            self._producer = self._new_producer()
        return self._producer

    def _discard_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        # Nothing of a finished round is left to deliver; whatever a failed round left behind
        # must not be delivered later, after the relay has handed its rows back.
        producer.purge()
        producer.flush(0)
        close = getattr(producer, "close", None)  # confluent-kafka 2.12+
        if callable(close):
            close()

    def _client_error(self, error: Any) -> None:
        text = clean_text(error.str())
        self._last_error = text
        if error.fatal():
            log_event(log, logging.ERROR, "kafka.fatal", url=self._shown, error=text)
        elif text != self._logged_error:
            log_event(log, logging.WARNING, "kafka.error", url=self._shown, error=text)
        self._logged_error = text


class _ClientLog:
    """librdkafka's own log lines, as debug events: what matters reaches ``error_cb``, and the
    client repeats a connection failure every reconnect backoff."""

    def log(self, level: int, msg: str, *args: object) -> None:
        if log.isEnabledFor(logging.DEBUG):
            line = msg % args if args else msg
            log_event(log, logging.DEBUG, "kafka.client", client_level=level, line=line)


# -- reading reports ----------------------------------------------------------------------------


def _failed(reports: _Pass, index: int) -> bool:
    return not reports.arrived[index] or reports.errors[index] is not None


def _confirmed(count: int) -> str:
    """How the messages say the confirmed prefix, without "the 0 before it are"."""
    if count == 0:
        return "none before it was confirmed"
    return f"the {count} before it {'is' if count == 1 else 'are'} confirmed"


def _shared(reports: _Pass, topics: Sequence[str], index: int) -> bool:
    """Whether another record of ``index``'s partition came back with a batch-wide refusal,
    so the record that failed first may only have shared a batch with the one at fault."""
    where = (topics[index], reports.partitions[index])
    return any(
        other != index
        and reports.errors[other] is not None
        and error_name(reports.errors[other]) in BATCH_REFUSALS
        and (topics[other], reports.partitions[other]) == where
        for other in range(len(topics))
    )


# -- the URL ----------------------------------------------------------------------------------


def from_url(url: str) -> KafkaPublisher:
    """Build a :class:`KafkaPublisher` from a ``kafka://`` URL (the CLI's ``--publisher``).

    ``kafka://[user:password@]host[:port][,host[:port]...][?option=value&...]``; the port
    defaults to 9092. With a user and password the connection authenticates with SASL
    (``PLAIN`` unless ``sasl_mechanism`` says otherwise) over TLS (``sasl_ssl``) unless
    ``security_protocol`` says otherwise. Query options (each at most once):

    ``topic``
        Topic name pattern, ``{queue}`` replaced by the queue (URL-encode the braces as
        ``%7Bqueue%7D`` if your tooling mangles them). Default ``{queue}``.
    ``delivery_timeout``
        Seconds each message has to be confirmed. Default 10.
    ``linger_ms``
        Milliseconds the client waits to fill a batch (librdkafka's ``linger.ms``). Default 5.
    ``compression``
        ``none`` (default), ``gzip``, ``snappy``, ``lz4`` or ``zstd``.
    ``message_max_bytes``
        The largest record the client sends; larger ones are refused before sending. Default
        1000000 (librdkafka's). Keep it at most the topic's ``max.message.bytes``.
    ``auto_create_topics``
        ``true`` (default) or ``false``: whether producing to a missing topic asks the broker
        to create it (the broker must allow it too).
    ``client_id``
        The client id brokers log and apply quotas to. Default ``sqla-outbox``.
    ``security_protocol``
        ``plaintext``, ``ssl``, ``sasl_plaintext`` or ``sasl_ssl``.
    ``sasl_mechanism``
        ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``; needs a user and password.
    ``ssl_ca_location``, ``ssl_certificate_location``, ``ssl_key_location``
        TLS files (``ssl`` and ``sasl_ssl`` only).

    Anything else raises :class:`PublisherError` naming the option and listing the valid ones,
    so a misspelt ``lingr_ms`` is not silently ignored. Errors show the password as ``***``.
    """
    _require_client()
    return KafkaPublisher(**kafka_url.publisher_arguments(url))


def _check_topic(topic: object) -> str:
    if not isinstance(topic, str) or not topic:
        raise PublisherError(
            f"topic must be a non-empty topic name pattern, got {topic!r}; use e.g. "
            "topic=outbox.{queue}, or leave it out for {queue}."
        )
    rest = topic.replace(QUEUE_PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise PublisherError(
            f"topic pattern {topic!r} has braces other than {{queue}}, the only placeholder; "
            "use e.g. topic=outbox.{queue}."
        )
    return topic
