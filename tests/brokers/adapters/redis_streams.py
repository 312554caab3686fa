"""Redis Streams: a stream per queue on the shared Redis (db 0), read back with ``XRANGE``.

A refused queue is a key holding a string, so ``XADD`` to it answers ``WRONGTYPE``. The
restartable broker is a private redis-server with no persistence: it forgets its streams when it
stops, so the adapter reads them just before stopping it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import redis
from support import reachable_redis

from .. import throwaway
from ..conformance import PASSWORD, BadUrl, BrokerAdapter, Delivery
from ._redis import PrivateRedis, RedisQueues

REDIS_URL = "redis://127.0.0.1:6379/0"


def read_stream(client: redis.Redis, stream: str) -> list[Delivery]:
    """The entries of ``stream``, oldest first (``client`` decodes responses)."""
    return [delivery(fields) for _id, fields in client.xrange(stream) or []]


def delivery(entry: dict[str, str]) -> Delivery:
    fields: dict[str, object] = {name: entry.get(name) for name in RedisAdapter.fields}
    fields["input"] = json.loads(entry["input"])
    fields["max_attempts"] = int(entry["max_attempts"])
    # A stream entry's id is Redis's own: the key consumers deduplicate on is a field.
    return Delivery(fields, entry["idempotency_key"], entry.get("traceparent"))


class _Streams(RedisQueues):
    def __init__(self, client: redis.Redis, url: str) -> None:
        super().__init__(client, f"sqla-outbox-test-{uuid.uuid4().hex[:10]}-", read_stream)
        self.url = self.cli_url = url


class RedisAdapter(BrokerAdapter):
    name = "redis"
    module = "sqla_outbox.publishers.redis_streams"
    docs_page = "redis.md"
    example_url = "redis://localhost:6379/0"
    constructor = "redis_streams.RedisStreamsPublisher('redis://localhost:6379/0')"
    outage_within = 3.0  # socket_timeout=1
    unreachable_says = (
        r"did not confirm a batch of \d+: ConnectionError: .*Connection refused.*"
        r"the relay retries on a later pass"
    )
    refusal_says = r"WRONGTYPE"
    bad_urls: ClassVar[Mapping[str, BadUrl]] = {
        "malformed": BadUrl.of("redis://h:port/0", "is malformed"),
        "scheme": BadUrl.of("amqp://h", "scheme 'amqp'"),
        "option twice": BadUrl.of("redis://h?maxlen=1&maxlen=2", "sets option 'maxlen' twice"),
        "password": BadUrl.of(f"redis://user:{PASSWORD}@h?maxlen=x", "maxlen='x'", "user:***@"),
        "maxlen zero": BadUrl.of("redis://h?maxlen=0", "maxlen must be a positive whole", "got 0"),
        "maxlen text": BadUrl.of("redis://h?maxlen=lots", "maxlen='lots'"),
        "unknown option": BadUrl.of("redis://h?maxln=5", "unknown option 'maxln'"),
        "other braces": BadUrl.of("redis://h?stream={q}", "braces other than {queue}"),
        "empty stream": BadUrl.of("redis://h?stream=", "stream must be a non-empty", "got ''"),
        "zero timeout": BadUrl.of(
            "redis://h?socket_timeout=0", "socket_timeout must be a positive", "got 0.0"
        ),
        "text timeout": BadUrl.of("redis://h?socket_timeout=soon", "socket_timeout='soon'"),
        "database": BadUrl.of("redis://h/zero", "database 'zero'"),
        "no host": BadUrl.of("redis:///0", "names no host"),
        "tls option": BadUrl.of("redis://h?ssl_cert_reqs=none", "TLS option, on a plain redis://"),
        "tls value": BadUrl.of("rediss://h?ssl_cert_reqs=maybe", "ssl_cert_reqs='maybe'"),
    }

    @contextmanager
    def sandbox(self) -> Iterator[_Streams]:
        with reachable_redis(REDIS_URL, socket_timeout=3, decode_responses=True) as client:
            streams = _Streams(client, f"{REDIS_URL}?socket_timeout=3")
            try:
                yield streams
            finally:
                streams.clean()

    def unreachable_url(self, port: int) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{port}/0?socket_timeout=1"

    @contextmanager
    def restartable(self, workdir: Path) -> Iterator[PrivateRedis]:
        with throwaway.redis_server(workdir) as server:
            url = f"redis://127.0.0.1:{server.port}/0?socket_timeout=1"
            yield PrivateRedis(server, url, read_stream, decode=True)


ADAPTER = RedisAdapter()
