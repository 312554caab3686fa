"""``handler``: a consumer's message function made effectively once.

Wraps ``fn(session, message)`` into ``fn(message)``: open a session, begin, read the message's
key (:func:`~sqla_outbox.inbox.key_of`, or the ``key`` function given), :func:`receive` it, run
``fn`` only if the key is new, commit. The key and ``fn``'s writes commit together; if ``fn``
raises, both roll back and the exception propagates, so the broker redelivers and the next
delivery runs ``fn`` again.

Acknowledge the broker's delivery **after** the wrapped function returns, never before: a crash
between the commit and the ack makes the broker deliver again, and the committed key then
absorbs it. Per broker: Celery, with ``acks_late=True`` on the task (the default acknowledges
before the task runs); Redis Streams, ``XACK`` after the call; RabbitMQ, ``basic_ack`` after
the call (not ``auto_ack``); NATS JetStream, ``msg.ack()`` after the call; Kafka, commit the
offset after the call (``enable.auto.commit=false``); HTTP, answer 2xx after the call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from sqla_outbox.inbox.keys import key_of
from sqla_outbox.inbox.receiving import DEFAULT_CONSUMER, receive

__all__ = ["handler"]

M = TypeVar("M")


def handler(
    sessions: Callable[[], Session],
    *,
    consumer: str = DEFAULT_CONSUMER,
    key: Callable[[Any], str] = key_of,
) -> Callable[[Callable[[Session, M], object]], Callable[[M], bool]]:
    """A decorator making ``fn(session, message)`` run once per message key (module docs).

    :param sessions: makes a new ``Session`` (a ``sessionmaker``).
    :param consumer: the consumer's name in the inbox.
    :param key: reads the idempotency key from a message (default :func:`key_of`).

    The wrapped function takes the message and returns ``True`` when it ran ``fn`` (and
    committed), ``False`` for a duplicate it absorbed.
    """

    def decorate(fn: Callable[[Session, M], object]) -> Callable[[M], bool]:
        @functools.wraps(fn)
        def handle(message: M) -> bool:
            message_key = key(message)
            with sessions() as session, session.begin():
                if not receive(session, message_key, consumer=consumer):
                    return False
                fn(session, message)
            return True

        return handle

    return decorate
