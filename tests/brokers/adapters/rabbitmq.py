"""RabbitMQ: a durable queue per queue on the shared broker (default exchange), read with
``basic_get``.

A refused queue is one that was never declared: with ``mandatory=True`` the broker returns the
message as unroutable. The shared broker is never stopped; the restartable one is a TCP proxy in
front of it, cut and restored on the same port, which is what a client sees when its broker
restarts.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import pika
import pytest

from .. import throwaway
from ..conformance import PASSWORD, BadUrl, BrokerAdapter, Delivery, wait_for

AMQP_URL = os.environ.get("SQLA_OUTBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def delivery(properties: Any, body: bytes) -> Delivery:
    headers = properties.headers or {}
    fields = {name: headers.get(name) for name in RabbitMQAdapter.fields}
    fields["input"] = json.loads(body)
    return Delivery(fields, properties.message_id, headers.get("traceparent"))


class _Queues:
    """Queues on the shared broker; what arrives is taken off them, so it is kept here."""

    def __init__(self, channel: Any, url: str) -> None:
        self.channel = channel
        self.url = self.cli_url = url
        self.run = uuid.uuid4().hex[:10]
        self.declared: list[str] = []
        self.taken: dict[str, list[Delivery]] = {}

    def queue(self, label: str) -> str:
        name = f"sqla-outbox-test-{self.run}-{label}"
        if name not in self.declared:
            self.accept(name)
        return name

    def refused_queue(self) -> str:
        return f"sqla-outbox-test-{self.run}-missing-{uuid.uuid4().hex[:6]}"

    def accept(self, queue: str) -> None:
        self.channel.queue_declare(queue, durable=True)
        self.declared.append(queue)

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        return wait_for(lambda: self._take(queue), count, f"queue {queue!r}")

    def _take(self, queue: str) -> list[Delivery]:
        taken = self.taken.setdefault(queue, [])
        if queue in self.declared:
            while True:
                method, properties, body = self.channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                taken.append(delivery(properties, body))
        return list(taken)

    def clean(self) -> None:
        for name in self.declared:
            self.channel.queue_delete(name)


class _Proxied:
    def __init__(self, queues: _Queues, proxy: throwaway.TcpProxy) -> None:
        self.queues, self.proxy = queues, proxy
        parts = urlsplit(AMQP_URL)
        netloc = f"{parts.netloc.rpartition('@')[0]}@127.0.0.1:{proxy.port}"
        query = "connection_attempts=1&socket_timeout=1"
        self.url = parts._replace(netloc=netloc, query=query).geturl()

    def queue(self, label: str) -> str:
        return self.queues.queue(label)

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        return self.queues.received(queue, count)

    def stop(self) -> None:
        self.proxy.cut()

    def start(self) -> None:
        self.proxy.start()


class RabbitMQAdapter(BrokerAdapter):
    name = "rabbitmq"
    module = "sqla_outbox.publishers.rabbitmq"
    docs_page = "rabbitmq.md"
    example_url = "amqp://guest:guest@localhost:5672/%2F"
    constructor = "rabbitmq.RabbitMQPublisher('amqp://localhost/')"
    outage_within = 5.0  # socket_timeout=2, one connection attempt
    unreachable_says = (
        r"Could not connect to RabbitMQ at amqp://guest:\*\*\*@127\.0\.0\.1:\d+/"
        r".*ConnectionRefused"
    )
    refusal_says = r"unroutable .* declare the queue '[^']+' \(durable\)"
    bad_urls: ClassVar[Mapping[str, BadUrl]] = {
        "malformed": BadUrl.of("amqp://host:notaport/", "is malformed"),
        "scheme": BadUrl.of("kafka://host/", "use amqp:// or amqps://"),
        "option twice": BadUrl.of("amqp://host/?exchange=a&exchange=b", "'exchange' twice"),
        "password": BadUrl.of(
            f"amqp://user:{PASSWORD}@host/?no_such_option=1", "amqp://user:***@host/"
        ),
        "vhost path": BadUrl.of("amqp://host/one/two", "percent-encode"),
        "unknown option": BadUrl.of("amqp://host/?no_such_option=1", "no_such_option"),
        "pika option": BadUrl.of("amqp://host/?heartbeat=soon", "heartbeat"),
    }

    @contextmanager
    def sandbox(self) -> Iterator[_Queues]:
        with self._channel() as channel:
            queues = _Queues(channel, AMQP_URL)
            try:
                yield queues
            finally:
                queues.clean()

    def unreachable_url(self, port: int) -> str:
        return (
            f"amqp://guest:{PASSWORD}@127.0.0.1:{port}/%2F?connection_attempts=1&socket_timeout=2"
        )

    @contextmanager
    def restartable(self, workdir: Path) -> Iterator[_Proxied]:
        with self.sandbox() as queues, throwaway.TcpProxy(urlsplit(AMQP_URL).port or 5672) as proxy:
            yield _Proxied(queues, proxy)

    @contextmanager
    def _channel(self) -> Iterator[Any]:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        except pika.exceptions.AMQPError as error:
            pytest.skip(
                f"RabbitMQ is not reachable at {AMQP_URL.rpartition('@')[2]}: {error!r}; "
                "start it (rabbitmq-server) or set SQLA_OUTBOX_AMQP_URL"
            )
        try:
            yield connection.channel()
        finally:
            connection.close()


ADAPTER = RabbitMQAdapter()
