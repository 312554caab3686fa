"""Every bundled broker publisher tells an outage from a message failure (docs/publishers.md).

One suite, run against each broker. With nothing listening where the broker should be,
``publish`` and ``publish_batch`` fail as an *outage* (a ``BrokerUnavailableError``, or an
exception caused by one) within seconds, confirming nothing and showing no password. A message
the reachable broker answers and refuses for itself (its destination is missing or of the wrong
kind) fails as a *message failure*, never as an outage, and a batch counts the confirmed prefix
before it. What only one broker does (which of its answers are outages, a batch cut short by a
lost connection) is pinned in that broker's own test file.

The shared brokers are never stopped: "unreachable" is a free port nobody listens on. A case
whose broker or client library is missing is skipped, saying which.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from support import free_port, reachable_redis

from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers import batch_function

from .outage import confirmed, is_outage

REDIS_URL = "redis://127.0.0.1:6379/0"
AMQP_URL = os.environ.get("SQLA_OUTBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
NATS_URL = "nats://127.0.0.1:4222"
PASSWORD = "s3cret"  # in every unreachable URL; no error may show it
BOUND = 15.0  # seconds an unreachable broker may take to fail a publish and a batch


@dataclass(frozen=True)
class Refusal:
    """A publisher on a reachable broker, a message it takes, and one it refuses."""

    publisher: Any
    good: OutboxMessage
    refused: OutboxMessage


@dataclass(frozen=True)
class Broker:
    """How the suite reaches one broker: down (on a free port) and up (refusing a message)."""

    name: str
    unreachable: Callable[[int], AbstractContextManager[Any]]
    refusal: Callable[[], AbstractContextManager[Refusal]]


def message(queue: str) -> OutboxMessage:
    now = dt.datetime.now(dt.timezone.utc)
    return OutboxMessage(uuid.uuid4(), "send_email", queue, {"n": 1}, uuid.uuid4().hex, 3,
                         now, now)  # fmt: skip


def raised(call: Callable[[], object]) -> Exception:
    """The exception ``call`` raises; the test fails if it returns."""
    try:
        call()
    except Exception as error:
        return error
    pytest.fail("the publish succeeded, but it was expected to fail")


def unique(label: str) -> str:
    return f"sqla-outbox-test-{label}-{uuid.uuid4().hex[:10]}"


# --- Redis Streams -----------------------------------------------------------------------------


@contextmanager
def redis_unreachable(port: int) -> Iterator[Any]:
    pytest.importorskip("redis", reason='needs pip install "sqla-outbox[redis]"')
    from sqla_outbox.publishers.redis_streams import from_url  # noqa: PLC0415 - optional extra

    publisher = from_url(f"redis://:{PASSWORD}@127.0.0.1:{port}/0?socket_timeout=1")
    try:
        yield publisher
    finally:
        publisher.close()


@contextmanager
def redis_refusal() -> Iterator[Refusal]:
    pytest.importorskip("redis", reason='needs pip install "sqla-outbox[redis]"')
    from sqla_outbox.publishers.redis_streams import RedisStreamsPublisher  # noqa: PLC0415

    good, bad = unique("good"), unique("bad")
    with reachable_redis(REDIS_URL, socket_timeout=3) as client:
        client.set(bad, "not a stream")  # XADD to it: WRONGTYPE
        publisher = RedisStreamsPublisher(REDIS_URL)
        try:
            yield Refusal(publisher, message(good), message(bad))
        finally:
            publisher.close()
            client.delete(good, bad)


# --- RabbitMQ ----------------------------------------------------------------------------------


@contextmanager
def rabbitmq_unreachable(port: int) -> Iterator[Any]:
    pytest.importorskip("pika", reason='needs pip install "sqla-outbox[rabbitmq]"')
    from sqla_outbox.publishers import rabbitmq  # noqa: PLC0415 - optional extra

    url = f"amqp://guest:{PASSWORD}@127.0.0.1:{port}/%2F?connection_attempts=1&socket_timeout=2"
    with rabbitmq.from_url(url) as publisher:
        yield publisher


@contextmanager
def rabbitmq_refusal() -> Iterator[Refusal]:
    pika = pytest.importorskip("pika", reason='needs pip install "sqla-outbox[rabbitmq]"')
    from sqla_outbox.publishers import rabbitmq  # noqa: PLC0415 - optional extra

    try:
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    except pika.exceptions.AMQPError as error:
        pytest.skip(f"RabbitMQ is not reachable at {AMQP_URL.rpartition('@')[2]}: {error!r}")
    channel = connection.channel()
    queue = unique("present")
    channel.queue_declare(queue, durable=True)
    try:
        with rabbitmq.from_url(AMQP_URL) as publisher:
            # No queue is bound to the missing name: returned as unroutable (mandatory=True).
            yield Refusal(publisher, message(queue), message(unique("missing")))
    finally:
        channel.queue_delete(queue)
        connection.close()


# --- NATS JetStream ----------------------------------------------------------------------------


def jetstream(action: Callable[[Any], Any]) -> None:
    """Run ``action(js)`` on a short-lived connection of the test's own to the shared server."""
    import nats  # noqa: PLC0415 - optional extra

    async def run() -> None:
        nc = await nats.connect(NATS_URL, connect_timeout=3, allow_reconnect=False)
        try:
            await action(nc.jetstream(timeout=5))
        finally:
            await nc.close()

    asyncio.run(run())


@contextmanager
def nats_unreachable(port: int) -> Iterator[Any]:
    pytest.importorskip("nats", reason='needs pip install "sqla-outbox[nats]"')
    from sqla_outbox.publishers.nats_jetstream import from_url  # noqa: PLC0415

    publisher = from_url(f"nats://relay:{PASSWORD}@127.0.0.1:{port}?timeout=1")
    try:
        yield publisher
    finally:
        publisher.close()


@contextmanager
def nats_refusal() -> Iterator[Refusal]:
    pytest.importorskip("nats", reason='needs pip install "sqla-outbox[nats]"')
    from sqla_outbox.publishers.nats_jetstream import from_url  # noqa: PLC0415

    run = uuid.uuid4().hex[:10]
    prefix, stream = f"sqla-outbox-test-{run}", f"SQLA_OUTBOX_TEST_{run}"
    try:
        # Only <prefix>.good is stored; <prefix>.nostream has no stream ("no responders").
        jetstream(lambda js: js.add_stream(name=stream, subjects=[f"{prefix}.good"]))
    except Exception as error:
        pytest.skip(f"NATS with JetStream is not reachable at {NATS_URL}: {error!r}")
    publisher = from_url(f"{NATS_URL}?subject_prefix={prefix}.&timeout=3")
    try:
        yield Refusal(publisher, message("good"), message("nostream"))
    finally:
        publisher.close()
        jetstream(lambda js: js.delete_stream(stream))


# --- HTTP webhook ------------------------------------------------------------------------------


@contextmanager
def http_unreachable(port: int) -> Iterator[Any]:
    pytest.importorskip("httpx", reason='needs pip install "sqla-outbox[http]"')
    from sqla_outbox.publishers.http_webhook import WebhookPublisher  # noqa: PLC0415

    with WebhookPublisher(f"http://relay:{PASSWORD}@127.0.0.1:{port}/hook?timeout=2") as made:
        yield made


@contextmanager
def http_refusal() -> Iterator[Refusal]:
    pytest.importorskip("httpx", reason='needs pip install "sqla-outbox[http]"')
    from sqla_outbox.publishers.http_webhook import WebhookPublisher  # noqa: PLC0415

    from .endpoint import Endpoint  # noqa: PLC0415 - only this case needs a receiver

    endpoint = Endpoint()
    refused = message("webhooks")
    endpoint.answers[str(refused.id)] = (422, '{"error": "unknown job"}', {})
    try:
        with WebhookPublisher(endpoint.url()) as publisher:
            yield Refusal(publisher, message("webhooks"), refused)
    finally:
        endpoint.shut()


# --- Celery ------------------------------------------------------------------------------------


@contextmanager
def celery_unreachable(port: int) -> Iterator[Any]:
    pytest.importorskip("celery", reason='needs pip install "sqla-outbox[celery]"')
    from celery import Celery  # noqa: PLC0415 - optional extra

    from sqla_outbox.publishers.celery_tasks import CeleryPublisher  # noqa: PLC0415

    app = Celery("down", broker=f"redis://:{PASSWORD}@127.0.0.1:{port}/0", set_as_current=False)
    publisher = CeleryPublisher(app)
    try:
        yield publisher
    finally:
        publisher.close()
        app.close()


@contextmanager
def celery_refusal() -> Iterator[Refusal]:
    pytest.importorskip("celery", reason='needs pip install "sqla-outbox[celery]"')
    from sqla_outbox.publishers.celery_tasks import CeleryPublisher  # noqa: PLC0415

    from . import celery_app_for_tests as tasks  # noqa: PLC0415 - imports Celery

    base = unique("celery")
    with reachable_redis(tasks.REDIS_URL, socket_timeout=3) as client:
        client.set(f"{base}-bad", "not a list")  # kombu's LPUSH to it: WRONGTYPE
        # One by one, so the message before the refused one is confirmed on its own; a
        # pipeline that fails counts as none of it (test_celery.py pins that).
        publisher = CeleryPublisher(tasks.app, pipeline=False)
        try:
            yield Refusal(publisher, message(f"{base}-good"), message(f"{base}-bad"))
        finally:
            publisher.close()
            for key in client.scan_iter(match=f"*{base}*"):
                client.delete(key)


BROKERS = [
    Broker("redis", redis_unreachable, redis_refusal),
    Broker("rabbitmq", rabbitmq_unreachable, rabbitmq_refusal),
    Broker("nats", nats_unreachable, nats_refusal),
    Broker("http", http_unreachable, http_refusal),
    Broker("celery", celery_unreachable, celery_refusal),
]


@pytest.mark.parametrize("broker", BROKERS, ids=[broker.name for broker in BROKERS])
def test_an_unreachable_broker_fails_as_an_outage(broker: Broker) -> None:
    """Nothing listening on the broker's port: ``publish`` and ``publish_batch`` raise an outage
    (a BrokerUnavailableError or one as ``__cause__``) that confirms nothing, within seconds
    rather than hanging the relay, and no error shows the URL's password."""
    with broker.unreachable(free_port()) as publisher:
        started = time.monotonic()
        errors = [raised(lambda: publisher.publish(message("emails")))]
        batch = batch_function(publisher)
        if batch is not None:
            errors.append(raised(lambda: batch([message("emails"), message("emails")])))
        elapsed = time.monotonic() - started
    for error in errors:
        assert is_outage(error), f"not an outage: {error!r}"
        assert confirmed(error) == 0
        assert PASSWORD not in str(error)
    assert elapsed < BOUND


@pytest.mark.parametrize("broker", BROKERS, ids=[broker.name for broker in BROKERS])
def test_a_message_the_broker_refuses_fails_as_a_message_failure(broker: Broker) -> None:
    """A reachable broker that answers and refuses one message (no queue, stream or key of the
    right kind for it; a 422 from the webhook): ``publish`` raises something that is not an
    outage, and a batch of a deliverable message and that one counts the first as confirmed."""
    with broker.refusal() as case:
        error = raised(lambda: case.publisher.publish(case.refused))
        assert not is_outage(error), f"a refusal reported as an outage: {error!r}"
        batch = batch_function(case.publisher)
        if batch is None:
            case.publisher.publish(case.good)
            return
        error = raised(lambda: batch([case.good, case.refused]))
    assert not is_outage(error), f"a refusal reported as an outage: {error!r}"
    assert confirmed(error) == 1
