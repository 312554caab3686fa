"""What only the RabbitMQ publisher promises; ``test_conformance.py`` runs the rest.

The shared scenarios (what arrives and in what order, bad URLs, outages, an unroutable message,
restarts through a proxy) run against RabbitMQ there through ``adapters/rabbitmq.py``. This file
pins RabbitMQ's own behaviour: the AMQP envelope, named exchanges, a channel or connection the
broker closes, a login or vhost it refuses, a connection lost mid-batch, nacks.

Every test declares its own uniquely named queue (and exchange) and deletes it afterwards, and
reads what arrived with pika's ``basic_get``: publisher confirms mean a message the relay counts
as published is already in the queue, so no waiting is needed. The broker is never restarted
(it is shared); a restart is stood in for by ``rabbitmqctl close_connection``, which sends the
same ``CONNECTION_FORCED`` close a stopping broker sends.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from sqlalchemy import Engine
from support import (
    MakeRelay,
    assert_charged,
    assert_uncharged,
    expire_backoffs,
    stage_inputs,
    wait_until,
)

from sqla_outbox.errors import PublishError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers import rabbitmq

from . import throwaway
from .outage import confirmed, is_outage

pika = pytest.importorskip(
    "pika", reason="pika is not installed: pip install 'sqla-outbox[rabbitmq]'"
)

AMQP_URL = os.environ.get("SQLA_OUTBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ENVELOPE = {"tenant_id": "tenant-7", "enqueued_by": "user:42", "traceparent": TRACEPARENT}


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _rabbitmq_reachable() -> None:
    try:
        pika.BlockingConnection(pika.URLParameters(AMQP_URL)).close()
    except pika.exceptions.AMQPError as error:
        pytest.skip(
            f"RabbitMQ is not reachable at {AMQP_URL.rpartition('@')[2]}: {error!r}; "
            "start it (rabbitmq-server) or set SQLA_OUTBOX_AMQP_URL"
        )


@pytest.fixture
def channel(_rabbitmq_reachable: None) -> Iterator[Any]:
    """The test's own channel, for declaring, inspecting and consuming; closed afterwards."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    yield connection.channel()
    connection.close()


@pytest.fixture
def declare(channel: Any) -> Iterator[Callable[[str], str]]:
    """Declare durable queues with a unique name for this test; delete them afterwards."""
    declared: list[str] = []

    def make(label: str) -> str:
        name = f"sqla-outbox-test-{label}-{uuid.uuid4().hex[:12]}"
        channel.queue_declare(name, durable=True)
        declared.append(name)
        return name

    yield make
    for name in declared:
        channel.queue_delete(name)


# --- helpers -----------------------------------------------------------------------------------


def enqueue(
    engine: Engine, queue: str, *inputs: Any, commit: bool = True, **options: Any
) -> list[OutboxMessage]:
    """Enqueue one job per input (with ``options``) in one transaction, committed or rolled
    back."""
    return stage_inputs(
        engine, "send_email", inputs, commit=commit, queue=queue, **ENVELOPE, **options
    )


def one_message(queue: str) -> OutboxMessage:
    """A message built directly, for tests that call the publisher without a relay."""
    now = dt.datetime.now(dt.timezone.utc)
    return OutboxMessage(uuid.uuid4(), "send_email", queue, {"n": 1}, uuid.uuid4().hex, 3,
                         now, now)  # fmt: skip


def drain_queue(channel: Any, queue: str) -> list[tuple[Any, Any, bytes]]:
    """Everything in ``queue`` right now, acknowledged, in queue order."""
    received: list[tuple[Any, Any, bytes]] = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return received
        received.append((method, properties, body))


def with_connection_name(url: str, name: str) -> str:
    """``url`` with a client-provided connection name, so rabbitmqctl can find the connection."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}client_properties={quote(repr({'connection_name': name}))}"


def rabbitmqctl(*args: str) -> str:
    result = subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout


def connections_named(name: str, state: str | None = "running") -> list[str]:
    """Broker-side pids of the connections in ``state`` (None: any) whose client gave ``name``."""
    listing = rabbitmqctl(
        "list_connections", "--no-table-headers", "pid", "state", "client_properties"
    )
    marker = f'{{"connection_name","{name}"}}'
    rows = [line.split("\t", 2) for line in listing.splitlines() if marker in line]
    return [pid for pid, row_state, _properties in rows if state in (None, row_state)]


# --- delivery ----------------------------------------------------------------------------------


def test_each_message_is_persistent_with_its_envelope_in_properties(
    channel: Any, declare: Callable[[str], str]
) -> None:
    """A message goes to the default exchange with its queue as routing key, persistent, as
    JSON; message_id is the idempotency key, type the job, app_id sqla-outbox, timestamp the
    staging second; headers carry every other field, so headers plus the decoded body rebuild
    the message as staged, and an unset field is absent rather than an AMQP void."""
    queue = declare("emails")
    sent = [one_message(queue)._replace(input={"to": "café"}, **ENVELOPE), one_message(queue)]
    with rabbitmq.from_url(AMQP_URL) as publisher:
        publisher.publish_batch(sent)

    received = drain_queue(channel, queue)
    for (method, properties, body), message in zip(received, sent, strict=True):
        assert method.exchange == "" and method.routing_key == queue
        assert properties.delivery_mode == 2
        assert properties.content_type == "application/json"
        assert properties.message_id == message.idempotency_key
        assert properties.type == "send_email" and properties.app_id == "sqla-outbox"
        assert properties.timestamp == int(message.staged_at.timestamp())
        staged = {k: v for k, v in message.to_dict().items() if v is not None}
        assert {**properties.headers, "input": json.loads(body)} == staged
    assert "tenant_id" not in received[1][1].headers


def test_a_named_exchange_routes_by_queue_name(
    pg_engine: Engine, channel: Any, declare: Callable[[str], str], make_relay: MakeRelay
) -> None:
    """With ?exchange=name, messages go to that exchange with the job's queue as routing key."""
    exchange = f"sqla-outbox-test-{uuid.uuid4().hex[:12]}"
    channel.exchange_declare(exchange, "direct", durable=False, auto_delete=False)
    try:
        bound = declare("bound")
        channel.queue_bind(bound, exchange, routing_key="billing")
        messages = enqueue(pg_engine, "billing", {"n": 1}, {"n": 2})
        publisher = rabbitmq.from_url(f"{AMQP_URL}?exchange={exchange}&heartbeat=30")
        assert make_relay(pg_engine, publisher).drain().published == 2
        received = drain_queue(channel, bound)
        assert [p.message_id for _m, p, _b in received] == [m.idempotency_key for m in messages]
        assert {m.exchange for m, _p, _b in received} == {exchange}
    finally:
        channel.exchange_delete(exchange)


# --- connection failures -----------------------------------------------------------------------


def test_a_channel_closed_by_the_broker_fails_the_pass_and_the_next_pass_reconnects(
    pg_engine: Engine, channel: Any, declare: Callable[[str], str], make_relay: MakeRelay
) -> None:
    """Deleting the exchange mid-life: 404 closes the channel, the pass fails with the fix (a
    message failure, charged to the first row; the rest of its transaction waits, uncharged);
    after the exchange is back and the backoff ends, the relay publishes on a new channel.
    """
    exchange = f"sqla-outbox-test-{uuid.uuid4().hex[:12]}"
    queue = declare("routed")

    def create_exchange() -> None:
        channel.exchange_declare(exchange, "direct", durable=False, auto_delete=False)
        channel.queue_bind(queue, exchange, routing_key=queue)

    create_exchange()
    try:
        publisher = rabbitmq.from_url(f"{AMQP_URL}?exchange={exchange}")
        relay = make_relay(pg_engine, publisher, retry_base=60)
        enqueue(pg_engine, queue, {"n": 1})
        assert relay.tick() == 1

        channel.exchange_delete(exchange)
        waiting = enqueue(pg_engine, queue, {"n": 2}, {"n": 3})
        result = relay.run_pass()
        assert result.failed and not result.outage and result.published == 0
        error = assert_charged(pg_engine, waiting[0], "404").last_error
        assert f"declare the exchange {exchange!r}" in error
        assert_uncharged(pg_engine, waiting[1:])
        assert relay.pending() == 2

        create_exchange()
        expire_backoffs(pg_engine)
        assert relay.drain().published == 2
        assert [json.loads(b) for _m, _p, b in drain_queue(channel, queue)] == [
            {"n": 1},
            {"n": 2},
            {"n": 3},
        ]
    finally:
        channel.exchange_delete(exchange)


@pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="rabbitmqctl is not installed")
def test_a_connection_closed_by_the_broker_is_replaced_before_the_next_send(
    pg_engine: Engine, channel: Any, declare: Callable[[str], str], make_relay: MakeRelay
) -> None:
    """A connection the broker force-closed (as on a restart) is noticed and replaced.

    The publisher reads the broker's close before sending anything, so the next pass reconnects
    and publishes everything, in order, on a new connection, and loses nothing.
    """
    queue = declare("forced")
    name = f"sqla-outbox-test-{uuid.uuid4().hex}"
    relay = make_relay(pg_engine, rabbitmq.from_url(with_connection_name(AMQP_URL, name)))
    enqueue(pg_engine, queue, {"n": 1})
    assert relay.tick() == 1
    [old] = connections_named(name)

    rabbitmqctl("close_connection", old, "sqla-outbox test: simulated broker restart")
    # "closed": the broker has sent its connection.close and now waits for the client's reply.
    wait_until(lambda: old in connections_named(name, "closed"), "the broker to close it")

    enqueue(pg_engine, queue, {"n": 2}, {"n": 3})
    assert relay.tick() == 2
    [new] = connections_named(name)
    assert new != old
    assert [json.loads(b) for _m, _p, b in drain_queue(channel, queue)] == [
        {"n": 1},
        {"n": 2},
        {"n": 3},
    ]
    relay.close()
    wait_until(
        lambda: not connections_named(name, None), "close() to close the publisher's connection"
    )


# --- outage or message failure ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (AMQP_URL.replace("guest:guest@", "guest:s3cret@"), "ACCESS_REFUSED"),
        (AMQP_URL.rpartition("/")[0] + "/no-such-vhost", "NOT_ALLOWED"),
    ],
    ids=["login-refused", "no-such-vhost"],
)
def test_a_broker_that_refuses_the_connection_is_an_outage(
    _rabbitmq_reachable: None, url: str, said: str
) -> None:
    """RabbitMQ is up but refuses the URL's login or vhost: nothing could be published with
    that URL, whatever the message, so it is an outage (RabbitMQUnavailableError, still a
    RabbitMQError), not a failure charged to the message; the password stays hidden."""
    with (
        rabbitmq.from_url(url) as publisher,
        pytest.raises(rabbitmq.RabbitMQUnavailableError, match=said) as info,
    ):
        publisher.publish(one_message("emails"))
    assert is_outage(info.value) and isinstance(info.value, rabbitmq.RabbitMQError)
    assert "s3cret" not in str(info.value)


def test_a_connection_lost_mid_batch_is_an_outage_after_the_confirmed_prefix(
    channel: Any, declare: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection goes (a proxy in front of the broker is cut) after two confirms: the batch
    raises RabbitMQUnavailableError with ``published=2``, so the relay marks exactly those two
    and charges no message for the outage; the two are in the queue, the rest is not. (The
    third message is sent without first reading the connection, as every message after a
    batch's first is: its send is what finds the connection gone.)"""
    queue = declare("cut")
    batch = [one_message(queue) for _ in range(4)]
    parts = urlsplit(AMQP_URL)
    with throwaway.TcpProxy(parts.port or 5672) as proxy:
        netloc = f"{parts.netloc.rpartition('@')[0]}@127.0.0.1:{proxy.port}"
        url = parts._replace(netloc=netloc, query="connection_attempts=1").geturl()
        with rabbitmq.from_url(url) as publisher:
            publish_one = publisher._publish_one

            def cut_after_the_second(message: OutboxMessage, **options: bool) -> None:
                publish_one(message, **options)
                if message is batch[1]:
                    proxy.cut()

            monkeypatch.setattr(publisher, "_publish_one", cut_after_the_second)
            with pytest.raises(rabbitmq.RabbitMQUnavailableError) as info:
                publisher.publish_batch(batch)
    assert is_outage(info.value) and confirmed(info.value) == 2
    assert "confirmed 2 of the 4 messages" in str(info.value)
    received = [p.message_id for _m, p, _b in drain_queue(channel, queue)]
    assert received == [m.idempotency_key for m in batch[:2]]


@pytest.mark.parametrize("refusal", ["nacked", "no-such-exchange"])
def test_a_message_rabbitmq_refuses_is_a_message_failure(
    channel: Any, declare: Callable[[str], str], refusal: str
) -> None:
    """Nacked (a full queue with reject-publish) and a channel closed for a missing exchange
    (404) are RabbitMQ's answers about this message or its destination, like unroutable (which
    the conformance suite pins): RabbitMQError from publish, PublishError with the confirmed
    prefix from a batch, never an outage."""
    ok = declare("ok")
    url, queue = AMQP_URL, ok
    if refusal == "nacked":
        queue = f"sqla-outbox-test-full-{uuid.uuid4().hex[:12]}"
        arguments = {"x-max-length": 0, "x-overflow": "reject-publish"}
        channel.queue_declare(queue, durable=True, arguments=arguments)
    else:
        url = f"{AMQP_URL}?exchange=sqla-outbox-test-missing-{uuid.uuid4().hex[:12]}"
    try:
        with rabbitmq.from_url(url) as publisher:
            with pytest.raises(rabbitmq.RabbitMQError) as single:
                publisher.publish(one_message(queue))
            first = [] if refusal == "no-such-exchange" else [one_message(ok)]
            with pytest.raises(PublishError) as batch:
                publisher.publish_batch([*first, one_message(queue)])
    finally:
        if refusal == "nacked":
            channel.queue_delete(queue)
    assert not is_outage(single.value)
    assert not isinstance(single.value, rabbitmq.RabbitMQUnavailableError)
    assert not is_outage(batch.value) and confirmed(batch.value) == len(first)


# --- configuration -----------------------------------------------------------------------------


def test_from_url_accepts_amqps_vhosts_and_pika_options() -> None:
    """amqps://, a percent-encoded vhost and pika's options parse without connecting."""
    publisher = rabbitmq.from_url(
        "amqps://u:p@broker.example:5671/my%2Fvhost?exchange=jobs&heartbeat=15"
        "&blocked_connection_timeout=5&connection_attempts=3"
    )
    assert publisher.exchange == "jobs"
    assert publisher._parameters.virtual_host == "my/vhost"
    assert publisher._parameters.ssl_options is not None
    assert publisher._parameters.heartbeat == 15
    assert publisher._parameters.blocked_connection_timeout == 5
    assert rabbitmq.from_url("amqp://localhost")._parameters.blocked_connection_timeout == 60
    assert "p@" not in repr(publisher)
    publisher.close()  # never connected: a no-op
