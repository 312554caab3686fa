"""What the two Redis-backed adapters (Celery on Redis lists, Redis Streams) share.

Both keep a queue per key on a shared Redis during a scenario, refuse a queue by making its key
a string (the publisher's ``LPUSH`` or ``XADD`` then answers ``WRONGTYPE``), and restart a
private redis-server without persistence, which forgets every key when it stops, so its queues
are read just before. They differ only in how a key's content becomes deliveries (``read``).
No ``ADAPTER`` here: the package's discovery passes this module by.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import redis

from .. import throwaway
from ..conformance import Delivery, wait_for

Read = Callable[[redis.Redis, str], list[Delivery]]
"""The deliveries a queue's key holds, oldest first."""


class RedisQueues:
    """A scenario's queues on a shared Redis: keys named ``prefix + label``, deleted after."""

    def __init__(self, client: redis.Redis, prefix: str, read: Read) -> None:
        self.client = client
        self.prefix = prefix
        self._read = read

    def queue(self, label: str) -> str:
        return f"{self.prefix}{label}"

    def refused_queue(self) -> str:
        name = self.queue(f"refused{uuid.uuid4().hex[:6]}")
        self.client.set(name, "not a queue")
        return name

    def accept(self, queue: str) -> None:
        self.client.delete(queue)

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        return wait_for(lambda: self._read(self.client, queue), count, f"{queue!r}")

    def clean(self) -> None:
        # The queues, and whatever else names them (kombu's bindings for their exchanges).
        for key in self.client.scan_iter(match=f"*{self.prefix}*"):
            self.client.delete(key)


class PrivateRedis:
    """A restartable redis-server of a test's own, at ``url``; its queues are read before it
    stops, as it keeps nothing across a restart."""

    def __init__(
        self, server: throwaway.BrokerProcess, url: str, read: Read, *, decode: bool
    ) -> None:
        self.server = server
        self.url = url
        self.before: dict[str, list[Delivery]] = {}
        self._read_key = read
        self._decode = decode

    def queue(self, label: str) -> str:
        self.before.setdefault(label, [])
        return label

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        return wait_for(lambda: self.before[queue] + self._read(queue), count, f"{queue!r}")

    def stop(self) -> None:
        for queue in self.before:
            self.before[queue] += self._read(queue)
        self.server.stop()

    def start(self) -> None:
        self.server.start()

    def _read(self, queue: str) -> list[Delivery]:
        port = self.server.port
        with redis.Redis(port=port, decode_responses=self._decode, socket_timeout=3) as client:
            return self._read_key(client, queue)
