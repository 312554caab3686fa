"""Consumers that deduplicate on the idempotency key: one per broker, one way to deduplicate.

Delivery is at least once: a relay killed between the broker's confirm and its mark publishes
the message again, with the same idempotency key. Each consumer below records that key in the
same transaction as the job's effect (``process_once``, through :mod:`sqla_outbox.inbox`), so a
second delivery changes nothing.

The broker clients are passed in (a ``redis.Redis``, a pika channel, a JetStream context, a
``confluent_kafka.Consumer``, a Celery app), so this module imports none of them.
``tests/test_docs.py`` delivers one message to every consumer twice, in the wire format the
bundled publisher writes, and checks that its effect ran once.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from sqla_outbox import inbox

# --8<-- [start:dedup]
Effect = Callable[[Session, Any], None]  # the job's own writes, given the message's input


def process_once(sessions: sessionmaker[Session], key: str, effect: Effect, input: Any) -> bool:
    """Run ``effect`` and record ``key`` in one transaction (the inbox). False, and nothing
    done, when a committed transaction recorded the key already: the message was processed."""
    with sessions() as session, session.begin():  # commits on leaving, or rolls back
        if not inbox.receive(session, key, consumer="mailer"):
            return False  # a duplicate (a concurrent delivery waited for the first's commit)
        effect(session, input)  # the effect and the key commit together, or neither does
    return True


# --8<-- [end:dedup]


# --8<-- [start:stdout]
def consume_lines(lines: Iterable[str], sessions: sessionmaker[Session], effect: Effect) -> int:
    """``sqla-outbox relay --publisher stdout``: one JSON object a line."""
    processed = 0
    for line in lines:
        message = json.loads(line)
        processed += process_once(sessions, message["idempotency_key"], effect, message["input"])
    return processed


# --8<-- [end:stdout]


# --8<-- [start:redis]
def consume_redis(
    client: Any,
    sessions: sessionmaker[Session],
    effect: Effect,
    *,
    stream: str = "outbox:emails",
    group: str = "mailers",
    consumer: str = "worker-1",
) -> int:
    """One read of a consumer group, with ``redis.Redis(decode_responses=True)``.

    The group is the consumer's to create, once:
    ``client.xgroup_create(stream, group, id="0", mkstream=True)``.
    """
    processed = 0
    reply = client.xreadgroup(group, consumer, {stream: ">"}, count=10, block=5000)
    for _stream, entries in reply or []:
        for entry_id, fields in entries:
            key = fields["idempotency_key"]  # a field of the stream entry
            processed += process_once(sessions, key, effect, json.loads(fields["input"]))
            client.xack(stream, group, entry_id)  # acknowledged either way
    return processed


# --8<-- [end:redis]


# --8<-- [start:rabbitmq]
def rabbitmq_callback(sessions: sessionmaker[Session], effect: Effect) -> Callable[..., None]:
    """A pika ``on_message_callback``: ``channel.basic_consume("emails", callback)``."""

    def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        key = properties.message_id  # the AMQP message_id property
        process_once(sessions, key, effect, json.loads(body))
        channel.basic_ack(method.delivery_tag)  # acknowledged either way

    return on_message


# --8<-- [end:rabbitmq]


# --8<-- [start:nats]
async def consume_nats(
    js: Any,
    sessions: sessionmaker[Session],
    effect: Effect,
    *,
    subject: str = "jobs.emails",
    durable: str = "mailers",
    stream: str = "OUTBOX",
) -> int:
    """One fetch of a JetStream pull consumer (nats-py); the database work runs off the loop."""
    subscription = await js.pull_subscribe(subject, durable=durable, stream=stream)
    processed = 0
    for msg in await subscription.fetch(10, timeout=5):
        key = msg.headers["Nats-Msg-Id"]  # the header JetStream deduplicates on too
        input = json.loads(msg.data)
        processed += await asyncio.to_thread(process_once, sessions, key, effect, input)
        await msg.ack()  # acknowledged either way
    return processed


# --8<-- [end:nats]


# --8<-- [start:kafka]
def consume_kafka(consumer: Any, sessions: sessionmaker[Session], effect: Effect) -> bool:
    """One poll of a ``confluent_kafka.Consumer`` created with ``enable.auto.commit: False``."""
    record = consumer.poll(1.0)
    if record is None or record.error():
        return False
    headers = dict(record.headers() or [])
    key = headers["idempotency-key"].decode()  # a record header; values are bytes
    process_once(sessions, key, effect, json.loads(record.value()))
    consumer.commit(message=record, asynchronous=False)  # committed either way
    return True


# --8<-- [end:kafka]


# --8<-- [start:webhook]
def verify(secret: bytes, headers: Mapping[str, str], body: bytes, tolerance: float = 300) -> bool:
    """Check ``X-Outbox-Signature`` over the raw body; refuse a timestamp older than
    ``tolerance`` seconds, so a captured request cannot be replayed later."""
    timestamp = headers["X-Outbox-Timestamp"]
    if abs(time.time() - int(timestamp)) > tolerance:
        return False
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(f"sha256={digest}", headers["X-Outbox-Signature"])


def receive_webhook(
    secret: bytes,
    headers: Mapping[str, str],
    body: bytes,
    sessions: sessionmaker[Session],
    effect: Effect,
) -> int:
    """One POST from the relay; returns the HTTP status to answer."""
    if not verify(secret, headers, body):
        return 401
    key = headers["Idempotency-Key"]  # also "idempotency_key" in the body
    process_once(sessions, key, effect, json.loads(body)["input"])
    return 200  # a key processed before is answered 2xx too, or the relay sends it again


# --8<-- [end:webhook]


# --8<-- [start:celery]
def register_tasks(app: Any, sessions: sessionmaker[Session], effect: Effect) -> Any:
    """The worker's task for the job ``billing.send_receipt``."""

    @app.task(bind=True, name="billing.send_receipt")
    def send_receipt(self: Any, order_id: int) -> bool:
        # The task id is the idempotency key: a second delivery has the same id.
        return process_once(sessions, self.request.id, effect, {"order_id": order_id})

    return send_receipt


# --8<-- [end:celery]
