"""Celery on Redis: the test app of ``celery_app_for_tests`` (db 10), a Celery queue per queue.

What arrived is read from the Redis list kombu pushes each task message onto, decoded the way a
worker decodes it (the JSON envelope, its base64 body ``[args, kwargs, embed]``): the broker's
view, with no worker in between. What a worker then makes of it (``self.request``, the arguments
a task is called with) is ``test_celery.py``'s, with a real worker.

The suite runs the publisher one message at a time (``?pipeline=false``): a scenario asks for the
exact confirmed prefix before a refused message, and a Redis pipeline Redis refuses part of counts
as none of it confirmed, which ``test_celery.py`` pins. A refused queue is a key holding a string
(kombu's ``LPUSH`` answers ``WRONGTYPE``). The restartable broker is a private redis-server with
no persistence, so the adapter reads its lists just before stopping it.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import redis
from support import reachable_redis

from .. import celery_app_for_tests as tasks
from .. import throwaway
from ..conformance import ALL_FIELDS, PASSWORD, BadUrl, BrokerAdapter, Delivery
from ._redis import PrivateRedis, RedisQueues

ONE_BY_ONE = "pipeline=false"

HEADERS = {
    "id": "outbox_id",
    "queue": "outbox_queue",
    "idempotency_key": "idempotency_key",
    "max_attempts": "max_attempts",
    "run_at": "run_at",
    "staged_at": "staged_at",
    "tenant_id": "tenant_id",
    "traceparent": "traceparent",
    "enqueued_by": "enqueued_by",
}
"""The task message header each field travels in; the job is the task name, the input its
arguments, and ``ordering_key`` does not travel."""


def delivery(raw: bytes) -> Delivery:
    """One task message as kombu stored it in Redis."""
    envelope = json.loads(raw)
    assert envelope["properties"]["body_encoding"] == "base64", envelope
    args, kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
    headers: dict[str, Any] = envelope["headers"]
    fields = {name: headers[header] for name, header in HEADERS.items()}
    fields["job"] = headers["task"]
    # The publisher's rule, read backwards: an object is keyword arguments, None no arguments,
    # anything else the one positional argument.
    assert not (args and kwargs) and len(args) <= 1, (args, kwargs)
    fields["input"] = kwargs or (args[0] if args else None)
    return Delivery(fields, headers["id"], headers["traceparent"])


def read_queue(client: redis.Redis, queue: str) -> list[Delivery]:
    # LPUSH adds at the head and workers pop the tail: the oldest message is last.
    return [delivery(raw) for raw in reversed(client.lrange(queue, 0, -1))]


class _Lists(RedisQueues):
    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client, f"sqla_outbox_test_{uuid.uuid4().hex[:10]}_", read_queue)
        self.url = f"celery:{tasks.__name__}:app?{ONE_BY_ONE}"
        # A subprocess imports the module from the repository root, under its full name.
        self.cli_url = f"celery:tests.brokers.celery_app_for_tests:app?{ONE_BY_ONE}"


class CeleryAdapter(BrokerAdapter):
    name = "celery"
    module = "sqla_outbox.publishers.celery_tasks"
    docs_page = "celery.md"
    example_url = "celery:myapp.worker:app"
    constructor = "celery_tasks.CeleryPublisher(object())"
    fields = ALL_FIELDS - {"ordering_key"}
    outage_within = 10.0  # kombu's bounded retries, then the connection error
    unreachable_says = r"could not be used: it took 0 of \d+ messages.*Connection refused"
    refusal_says = r"WRONGTYPE"
    bad_urls: ClassVar[Mapping[str, BadUrl]] = {
        name: BadUrl.of(url, says, repr(url))  # each sentence quotes the URL as given
        for name, url, says in [
            ("malformed", "celery:my app:app", "does not name a Celery app"),
            ("scheme", "redis://localhost", "is not a Celery URL"),
            ("option twice", "celery:json:dumps?pipeline=true&pipeline=false",
             "sets option 'pipeline' twice"),
            ("no module", "celery:nosuchmodule:app", "Cannot import module 'nosuchmodule'"),
            ("not an app", "celery:json:dumps", "which is not a celery.Celery app"),
            ("no attribute", "celery:json:no_such_name", "has no attribute 'no_such_name'"),
            ("no app in module", "celery:json", "has no Celery app"),
            ("a URL, not an app", "celery://broker:6379", "does not name a Celery app"),
            ("nothing", "celery:", "does not name a Celery app"),
            ("negative retries", "celery:json:dumps?max_retries=-1", "max_retries='-1'"),
            ("text retries", "celery:json:dumps?max_retries=many", "must be a whole number"),
            ("infinite step", "celery:json:dumps?interval_step=inf", "must be a finite number"),
            ("zero confirm timeout", "celery:json:dumps?confirm_timeout=0", "above 0"),
            ("flag", "celery:json:dumps?confirm=maybe", "must be true or false"),
            ("unknown option", "celery:json:dumps?bogus=1", "unknown option 'bogus'"),
            ("not a query", "celery:json:dumps?=&", "not a query string"),
        ]
    }  # fmt: skip

    @contextmanager
    def sandbox(self) -> Iterator[_Lists]:
        with reachable_redis(tasks.REDIS_URL, socket_timeout=3) as client:
            lists = _Lists(client)
            try:
                yield lists
            finally:
                lists.clean()

    def unreachable_url(self, port: int) -> str:
        # A Celery URL names an app; the password is in that app's broker URL.
        return f"{tasks.app_on(f'redis://:{PASSWORD}@127.0.0.1:{port}/0')}?{ONE_BY_ONE}"

    @contextmanager
    def restartable(self, workdir: Path) -> Iterator[PrivateRedis]:
        with throwaway.redis_server(workdir) as server:
            spec = tasks.app_on(f"redis://127.0.0.1:{server.port}/0")
            url = f"{spec}?{ONE_BY_ONE}&socket_timeout=1"
            yield PrivateRedis(server, url, read_queue, decode=False)


ADAPTER = CeleryAdapter()
