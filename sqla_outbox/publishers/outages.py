"""Outage or message failure: where the bundled publishers draw the line, and what they share.

A publisher that fails tells the relay one of two things, by the exception it raises:

An outage
    :class:`~sqla_outbox.errors.BrokerUnavailableError` (each broker has its own subclass), or
    an exception whose ``__cause__`` is one. Nothing could be published to this broker right
    now, *whatever the message*: it cannot be reached (connection refused, DNS, TLS, a
    timeout), the connection dropped mid-call, it is restarting, or it takes no writes at all
    (out of memory, a read-only replica, a resource alarm, credentials it refuses). The relay
    charges no row an attempt and backs off as a whole.
A message failure
    Any other exception. The broker answered and refused *this message or its destination*:
    too large, no queue, stream or subject for it, a full queue that nacks, a key of the wrong
    type, a 4xx from a webhook. The row is charged an attempt, retried with backoff, and
    dead-lettered after ``max_publish_attempts``.

The test for each condition is "would a different message have fared better?". If not, it is
an outage: charging the message would dead-letter the whole outbox, one row at a time, for a
broker that was down. If so, it is a message failure: calling it an outage would let one
message the broker will never take hold up the relay for good.

Each broker module applies the rule to its own client's exceptions (see each module and
``docs/brokers/``); this module holds what more than one of them needs: walking an exception's
causes (Celery wraps everything in kombu's errors) and reading a Redis error (the Redis Streams
publisher and Celery on Redis meet the same ones).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

__all__ = ["causes", "redis_unavailable"]

_CHAIN_LIMIT = 16  # a cause chain is a handful long; this only guards against a cycle

# Redis replies that refuse every write, whatever the key, and that redis-py does not map to a
# class of its own: NOREPLICAS (min-replicas-to-write not met), BUSY (a script is running),
# MISCONF (RDB snapshots failing with stop-writes-on-bgsave-error). redis-py prefixes the text
# with "Command # n (...) of pipeline caused error: " when it raises a pipeline's reply.
_REFUSES_EVERY_WRITE = re.compile(r"(?:^|caused error: )(?:NOREPLICAS|BUSY|MISCONF)\b")


def causes(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what it was raised from, outermost first.

    Follows ``__cause__``, and ``__context__`` where there is no cause and the context was not
    suppressed (``raise ... from None``): client libraries re-raise transport errors both ways.
    """
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen and len(seen) < _CHAIN_LIMIT:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__


def redis_unavailable(error: BaseException) -> bool | None:
    """Whether ``error``, from redis-py, means Redis takes no writes now, whatever the key;
    ``None`` when ``error`` is not a redis-py error at all.

    True for a connection that failed or timed out (which covers refused credentials and
    ``LOADING``, a Redis restarting), and for the replies that refuse every write: ``OOM``
    (``maxmemory`` reached), ``READONLY`` (a replica, e.g. after a failover),
    ``CLUSTERDOWN``/``MASTERDOWN``, ``TRYAGAIN``, ``NOREPLICAS``, ``BUSY`` and ``MISCONF``.
    False for every other reply (``WRONGTYPE``, ``NOPERM`` on a key, a syntax error): Redis
    answered about this key.
    """
    # Only redis-py raises its exceptions, so if it was never imported ``error`` is not one; this
    # keeps the Celery publisher from importing redis-py when its broker is RabbitMQ.
    exceptions = sys.modules.get("redis.exceptions")
    if exceptions is None or not isinstance(error, exceptions.RedisError):
        return None
    whole_server = (
        exceptions.ConnectionError,
        exceptions.TimeoutError,
        exceptions.OutOfMemoryError,
        exceptions.ReadOnlyError,
        exceptions.ClusterDownError,
        exceptions.TryAgainError,
    )
    if isinstance(error, whole_server):
        return True
    return isinstance(error, exceptions.ResponseError) and bool(
        _REFUSES_EVERY_WRITE.search(str(error))
    )
