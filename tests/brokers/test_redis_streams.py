"""What only the Redis Streams publisher promises; ``test_conformance.py`` runs the rest.

The shared scenarios (what arrives and in what order, bad URLs, outages, refusals, restarts)
run against Redis there through ``adapters/redis_streams.py``. This file pins Redis's own
behaviour: each attribute a string field of the entry, the stream pattern and trimming, a
pipeline that Redis refuses part of, which Redis replies are outages, and a restart the client
hides entirely. Tests use the shared Redis on 127.0.0.1:6379, each with its own stream names
(deleted afterwards), or a private redis-server (``throwaway``) when they change its settings
or restart it.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import reachable_redis

from sqla_outbox.errors import PublishError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers.outages import redis_unavailable
from sqla_outbox.publishers.redis_streams import RedisUnavailableError, from_url

from . import throwaway
from .conformance import TRACEPARENT
from .outage import confirmed, is_outage

REDIS_URL = "redis://127.0.0.1:6379/0"

Entry = dict[str, str]


# --- helpers -----------------------------------------------------------------------------------


@pytest.fixture
def shared_redis() -> Iterator[redis.Redis]:
    """A client of the shared Redis; skips the test when it is not running."""
    with reachable_redis(REDIS_URL, socket_timeout=3, decode_responses=True) as client:
        yield client


@pytest.fixture
def names(shared_redis: redis.Redis) -> Iterator[Callable[[str], str]]:
    """Unique key names for this test (``names('emails')``), all deleted when it ends."""
    run = uuid.uuid4().hex[:10]
    yield lambda base: f"sqla-outbox-test-{run}-{base}"
    keys = list(shared_redis.scan_iter(match=f"sqla-outbox-test-{run}-*"))
    if keys:
        shared_redis.delete(*keys)


def read_stream(client: redis.Redis, stream: str) -> list[Entry]:
    """Every entry of ``stream``, oldest first, as str -> str (client must decode)."""
    entries = client.xrange(stream) or []
    return [{str(k): str(v) for k, v in (fields or {}).items()} for _entry_id, fields in entries]


def message_for(queue: str, key: str, **fields: object) -> OutboxMessage:
    now = dt.datetime.now(dt.timezone.utc)
    made = OutboxMessage(uuid.uuid4(), "job", queue, {"key": key}, key, 3, now, now)
    return made._replace(**fields)


# --- delivery ----------------------------------------------------------------------------------


def test_each_attribute_is_one_string_field_and_unset_ones_are_left_out(
    shared_redis: redis.Redis, names: Callable[[str], str]
) -> None:
    """A Redis field holds only a string: input is compact JSON with non-ASCII kept as is,
    max_attempts decimal, times ISO 8601 with their offset, and tenant_id, traceparent,
    enqueued_by and ordering_key are absent, not empty, when unset."""
    stream = names("fields")
    full = message_for(stream, "full", input={"to": "ünïcode@example.com", "n": [1, 2]},
                       tenant_id="acme", traceparent=TRACEPARENT, enqueued_by="user:7",
                       ordering_key="order-7")  # fmt: skip
    bare = message_for(stream, "bare")
    publisher = from_url(REDIS_URL)
    try:
        publisher.publish_batch([full, bare])
    finally:
        publisher.close()

    first, second = read_stream(shared_redis, stream)
    assert first["input"] == '{"to":"ünïcode@example.com","n":[1,2]}'
    assert first["max_attempts"] == "3"
    assert first["run_at"] == full.run_at.isoformat()
    assert dt.datetime.fromisoformat(first["staged_at"]).utcoffset() == dt.timedelta(0)
    assert (first["tenant_id"], first["ordering_key"]) == ("acme", "order-7")
    assert set(first) - set(second) == {"tenant_id", "traceparent", "enqueued_by", "ordering_key"}
    assert json.loads(second["input"]) == {"key": "bare"}


def test_stream_pattern_and_maxlen_come_from_the_url(
    shared_redis: redis.Redis, names: Callable[[str], str]
) -> None:
    """``?stream=<prefix>{queue}`` names the stream after the queue; ``?maxlen=`` trims it
    approximately (``MAXLEN ~``), so it stays far below what was appended."""
    prefix = names("pattern")
    publisher = from_url(f"{REDIS_URL}?stream={prefix}:{{queue}}&maxlen=10")
    now = dt.datetime.now(dt.timezone.utc)
    messages = [
        OutboxMessage(uuid.uuid4(), "job", "reports", {"n": n}, f"key-{n}", 3, now, now)
        for n in range(500)
    ]
    try:
        publisher.publish_batch(messages)
        publisher.publish(messages[0])
    finally:
        publisher.close()

    length = shared_redis.xlen(f"{prefix}:reports")
    assert 10 <= length < 500
    assert read_stream(shared_redis, f"{prefix}:reports")[-1]["idempotency_key"] == "key-0"


def test_a_refused_xadd_ends_the_confirmed_prefix_but_not_the_pipeline(
    shared_redis: redis.Redis, names: Callable[[str], str]
) -> None:
    """A pipeline whose second XADD Redis refuses (the key is not a stream) raises
    PublishError(published=1) naming the key, a message failure; the XADD after it, which Redis
    accepted although it cannot count as confirmed, is in the stream, and is appended again when
    the relay re-sends it: the documented reason consumers deduplicate on idempotency_key."""
    good, bad = names("good"), names("bad")
    shared_redis.set(bad, "not a stream")
    publisher = from_url(REDIS_URL)
    try:
        with pytest.raises(PublishError, match="WRONGTYPE") as info:
            publisher.publish_batch(
                [message_for(good, "a"), message_for(bad, "b"), message_for(good, "c")]
            )
    finally:
        publisher.close()
    assert confirmed(info.value) == 1 and not is_outage(info.value)
    assert repr(bad) in str(info.value)
    assert [entry["idempotency_key"] for entry in read_stream(shared_redis, good)] == ["a", "c"]


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379."), True),
        (redis.TimeoutError("Timeout reading from socket"), True),
        (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), True),
        (redis.exceptions.AuthenticationError("invalid username-password pair"), True),
        (redis.exceptions.OutOfMemoryError("command not allowed when used memory > ..."), True),
        (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), True),
        (redis.exceptions.ClusterDownError("The cluster is down"), True),
        (redis.exceptions.TryAgainError("Multiple keys request during rehashing"), True),
        (redis.ResponseError("BUSY Redis is busy running a script."), True),
        (redis.ResponseError("MISCONF Redis is configured to save RDB snapshots, but ..."), True),
        (
            redis.ResponseError("Command # 3 (XADD s) of pipeline caused error: NOREPLICAS ..."),
            True,
        ),
        (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"), False),
        (redis.exceptions.NoPermissionError("this user has no permissions to access ..."), False),
        (redis.ResponseError("ERR The ID specified in XADD is equal or smaller ..."), False),
        (ValueError("not from redis-py"), None),
    ],
)
def test_what_redis_answered_decides_between_outage_and_message_failure(
    error: Exception, outage: bool | None
) -> None:
    """A connection that failed and the replies that refuse every write (OOM, READONLY,
    LOADING, CLUSTERDOWN, TRYAGAIN, BUSY, MISCONF, NOREPLICAS, also inside redis-py's pipeline
    annotation) mean Redis takes nothing now: an outage. A reply about the key (WRONGTYPE,
    NOPERM, any other error) is a message failure; an error not from redis-py gets no verdict."""
    assert redis_unavailable(error) is outage


@pytest.mark.parametrize(
    ("condition", "reply"),
    [
        (("CONFIG", "SET", "maxmemory", "1"), "OutOfMemoryError"),
        (("REPLICAOF", "127.0.0.1", "1"), "ReadOnlyError"),  # a replica, of a master that is gone
        (("CONFIG", "SET", "min-replicas-to-write", "1"), "NOREPLICAS"),  # and it has none
    ],
    ids=["out-of-memory", "read-only-replica", "no-replicas"],
)
def test_a_redis_that_refuses_every_write_is_an_outage(
    tmp_path: Path, condition: tuple[str, ...], reply: str
) -> None:
    """Redis answers, but refuses every write (OOM at maxmemory, READONLY on a replica,
    NOREPLICAS under min-replicas-to-write): the batch raises RedisUnavailableError, an outage
    confirming nothing, since any other message would have been refused the same; once Redis
    takes writes again the same publisher works."""
    with throwaway.redis_server(tmp_path) as server:
        admin = redis.Redis(port=server.port, socket_timeout=3)
        publisher = from_url(f"redis://127.0.0.1:{server.port}/0?socket_timeout=1")
        try:
            admin.execute_command(*condition)
            with pytest.raises(RedisUnavailableError, match=reply) as info:
                publisher.publish_batch([message_for("full", "a"), message_for("full", "b")])
            admin.config_set("maxmemory", 0)
            admin.config_set("min-replicas-to-write", 0)
            admin.execute_command("REPLICAOF", "NO", "ONE")
            publisher.publish(message_for("full", "c"))
            length = admin.xlen("full")
        finally:
            publisher.close()
            admin.close()
    assert is_outage(info.value) and confirmed(info.value) == 0
    assert "taking no writes" in str(info.value)
    assert length == 1


# --- configuration -----------------------------------------------------------------------------


def test_from_url_keeps_tls_options_on_rediss() -> None:
    """rediss:// accepts redis-py's TLS options; stream and maxlen reach the publisher, and
    socket_timeout defaults to 5 s."""
    publisher = from_url("rediss://h:6380/2?ssl_cert_reqs=none&stream=jobs:{queue}&maxlen=7")
    assert (publisher.stream, publisher.maxlen, publisher.socket_timeout) == (
        "jobs:{queue}",
        7,
        5.0,
    )
    publisher.close()


# --- outage ------------------------------------------------------------------------------------


def test_a_restart_between_two_publishes_is_invisible_to_the_next_one(tmp_path: Path) -> None:
    """The client's pooled connection dies with the server; the first publish after the server
    is back reconnects transparently and succeeds, with no failed attempt in between."""
    with throwaway.redis_server(tmp_path) as server:
        publisher = from_url(f"redis://127.0.0.1:{server.port}/0?socket_timeout=1")
        reader = redis.Redis(port=server.port, decode_responses=True, socket_timeout=3)
        try:
            publisher.publish(message_for("after-restart", "first"))
            server.stop()
            server.start()
            publisher.publish(message_for("after-restart", "second"))
            keys = [entry["idempotency_key"] for entry in read_stream(reader, "after-restart")]
        finally:
            reader.close()
            publisher.close()
    assert keys == ["second"]  # this Redis keeps nothing across a restart
