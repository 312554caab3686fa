"""The Redis Streams publisher against a real Redis: what arrives, in what order, and outages.

Most tests use the shared Redis on 127.0.0.1:6379, each with its own stream names (deleted
afterwards). The outage test starts a private redis-server (``throwaway``) so it can stop and
restart it under a running relay. Relays run on a fresh PostgreSQL database per test.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine
from support import (
    WAIT,
    MakeRelay,
    Recorder,
    assert_charged,
    assert_uncharged,
    free_port,
    logged,
    publisher_error,
    reachable_redis,
    run_cli,
    stage,
    url_of,
    wait_until,
)

from sqla_outbox.errors import PublisherError, PublishError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers import redis_streams
from sqla_outbox.publishers.outages import redis_unavailable
from sqla_outbox.publishers.redis_streams import (
    RedisStreamsPublisher,
    RedisUnavailableError,
    from_url,
)

from . import throwaway
from .outage import confirmed, is_outage

REDIS_URL = "redis://127.0.0.1:6379/0"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

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
    made: list[str] = []

    def name(base: str) -> str:
        key = f"sqla-outbox-test-{run}-{base}"
        made.append(key)
        return key

    yield name
    keys = [key for key in made if "{" not in key]
    keys += list(shared_redis.scan_iter(match=f"sqla-outbox-test-{run}-*"))
    if keys:
        shared_redis.delete(*keys)


def read_stream(client: redis.Redis, stream: str) -> list[Entry]:
    """Every entry of ``stream``, oldest first, as str -> str (client must decode)."""
    entries = client.xrange(stream) or []
    return [{str(k): str(v) for k, v in (fields or {}).items()} for _entry_id, fields in entries]


def expected_entry(message: OutboxMessage) -> Entry:
    entry = {
        "id": str(message.id),
        "job": message.job,
        "queue": message.queue,
        "input": json.dumps(message.input, ensure_ascii=False, separators=(",", ":")),
        "idempotency_key": message.idempotency_key,
        "max_attempts": str(message.max_attempts),
    }
    for name in ("tenant_id", "traceparent", "enqueued_by"):
        value = getattr(message, name)
        if value is not None:
            entry[name] = value
    return entry


def without_times(entry: Entry) -> Entry:
    """``entry`` minus run_at/staged_at, after checking they are aware ISO 8601 timestamps."""
    rest = dict(entry)
    for name in ("run_at", "staged_at"):
        stamp = dt.datetime.fromisoformat(rest.pop(name))
        assert stamp.utcoffset() == dt.timedelta(0), entry
    return rest


def message_for(queue: str, key: str) -> OutboxMessage:
    now = dt.datetime.now(dt.timezone.utc)
    return OutboxMessage(uuid.uuid4(), "job", queue, {"key": key}, key, 3, now, now)


def unique_in_order(keys: list[str]) -> list[str]:
    return list(dict.fromkeys(keys))


# --- delivery ----------------------------------------------------------------------------------


def test_only_committed_messages_arrive_in_order_with_every_attribute(
    pg_engine: Engine, shared_redis: redis.Redis, names: Callable[[str], str], make_relay: MakeRelay
) -> None:
    """Committed messages land in the queue's stream in enqueue order, one field per attribute
    (input as JSON, times as ISO 8601, None attributes left out); rolled-back ones never do."""
    queue = names("emails")
    first = stage(pg_engine, queue, 3, tenant_id="acme", enqueued_by="user:7",
                  traceparent=TRACEPARENT)  # fmt: skip
    stage(pg_engine, queue, 2, commit=False, tenant_id="ghost")
    second = stage(pg_engine, queue, 2)  # no tenant, enqueuer or trace: fields absent
    committed = first + second

    relay = make_relay(pg_engine, RedisStreamsPublisher(REDIS_URL), batch_size=4)
    result = relay.drain()

    assert result.published == 5 and not result.failed
    assert relay.pending() == 0
    entries = read_stream(shared_redis, queue)
    assert [without_times(entry) for entry in entries] == [
        expected_entry(message) for message in committed
    ]
    assert "tenant_id" not in entries[-1] and "traceparent" not in entries[-1]
    assert entries[0]["traceparent"] == TRACEPARENT
    assert json.loads(entries[0]["input"]) == {"n": 0, "to": "ünïcode@example.com"}


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


def test_a_refused_xadd_confirms_exactly_the_prefix_before_it(
    pg_engine: Engine, shared_redis: redis.Redis, names: Callable[[str], str], make_relay: MakeRelay
) -> None:
    """A pipeline whose third XADD is refused (the key is not a stream) raises
    PublishError(published=2); the relay marks exactly those two and charges the third. The
    fourth, of another transaction, is not held back by it: the relay sends it again in a
    batch of its own and marks it once that batch is confirmed."""
    good, bad = names("good"), names("bad")
    shared_redis.set(bad, "not a stream")
    before = stage(pg_engine, good, 2)
    [refused] = stage(pg_engine, bad, 1)
    [after] = stage(pg_engine, good, 1)

    relay = make_relay(pg_engine, RedisStreamsPublisher(REDIS_URL), batch_size=10)
    result = relay.run_pass()

    assert (result.claimed, result.published, result.failed) == (4, 3, True)
    assert relay.pending() == 1
    assert_charged(pg_engine, refused, "WRONGTYPE")
    keys = [entry["idempotency_key"] for entry in read_stream(shared_redis, good)]
    # The first pipeline's fourth XADD was accepted by Redis although the relay could not count
    # it confirmed (it came after the refusal): the second batch appends it again, which is why
    # consumers deduplicate on idempotency_key.
    assert keys == [m.idempotency_key for m in (*before, after, after)]

    publisher = RedisStreamsPublisher(REDIS_URL)
    now = dt.datetime.now(dt.timezone.utc)
    message = OutboxMessage(uuid.uuid4(), "job", bad, None, "k", 1, now, now)
    with pytest.raises(PublishError, match=r"WRONGTYPE") as info:
        publisher.publish(message)
    publisher.close()
    assert info.value.published == 0
    assert bad in str(info.value)
    assert not is_outage(info.value)  # Redis answered about this key: a message failure


def test_an_unreachable_redis_fails_the_publish_within_socket_timeout() -> None:
    """Nothing listening: publish raises RedisUnavailableError(published=0), an outage, promptly
    instead of hanging the relay, and says the relay will retry."""
    publisher = from_url(f"redis://127.0.0.1:{free_port()}/0?socket_timeout=1")
    now = dt.datetime.now(dt.timezone.utc)
    message = OutboxMessage(uuid.uuid4(), "job", "q", None, "k", 1, now, now)
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError, match=r"retries on a later pass") as info:
        publisher.publish(message)
    publisher.close()
    assert info.value.published == 0 and is_outage(info.value)
    assert time.monotonic() - started < 3


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


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://h?maxlen=0", r"maxlen must be a positive whole number.*got 0"),
        ("redis://h?maxlen=lots", r"maxlen='lots'"),
        ("redis://h?maxln=5", r"unknown option 'maxln'"),
        ("redis://h?stream={q}", r"braces other than \{queue\}"),
        ("redis://h?stream=", r"stream must be a non-empty .*got ''"),
        ("redis://h?socket_timeout=0", r"socket_timeout must be a positive.*got 0\.0"),
        ("redis://h?socket_timeout=soon", r"socket_timeout='soon'"),
        ("redis://h?maxlen=1&maxlen=2", r"sets option 'maxlen' twice"),
        ("redis://h:port/0", r"is malformed"),
        ("redis://h/zero", r"database 'zero'"),
        ("redis:///0", r"names no host"),
        ("redis://h?ssl_cert_reqs=none", r"TLS option, on a plain redis:// URL"),
        ("rediss://h?ssl_cert_reqs=maybe", r"ssl_cert_reqs='maybe'"),
        ("amqp://h", r"scheme 'amqp'"),
    ],
)
def test_from_url_rejects_a_bad_url_in_one_sentence(url: str, expected: str) -> None:
    """A malformed URL or bad option is a PublisherError: one sentence with the value and the
    fix, raised by from_url before any connection is attempted."""
    publisher_error(from_url, url, match=expected)


def test_from_url_hides_the_password_and_keeps_tls_options() -> None:
    """Errors never print the password; rediss:// accepts redis-py's TLS options."""
    with pytest.raises(PublisherError) as info:
        from_url("redis://user:s3cret@h?maxlen=x")
    assert "s3cret" not in str(info.value) and "***" in str(info.value)
    publisher = from_url("rediss://h:6380/2?ssl_cert_reqs=none&stream=jobs:{queue}&maxlen=7")
    assert (publisher.stream, publisher.maxlen, publisher.socket_timeout) == (
        "jobs:{queue}",
        7,
        5.0,
    )
    publisher.close()


def test_a_missing_client_is_reported_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without redis-py, from_url says which extra to install instead of an ImportError."""
    monkeypatch.setattr(redis_streams, "_CLIENT_INSTALLED", False)
    with pytest.raises(PublisherError, match=r'pip install "sqla-outbox\[redis\]"'):
        from_url(REDIS_URL)


# --- command line ------------------------------------------------------------------------------


def test_cli_relay_once_publishes_to_redis(
    pg_engine: Engine, shared_redis: redis.Redis, names: Callable[[str], str]
) -> None:
    """`sqla-outbox relay --once --publisher redis://...` delivers the committed messages."""
    queue = names("cli")
    committed = stage(pg_engine, queue, 3)
    stage(pg_engine, queue, 1, commit=False)
    publisher = f"{REDIS_URL}?socket_timeout=3"
    result = run_cli("relay", "--once", "--url", url_of(pg_engine), "--publisher", publisher)
    assert result.returncode == 0, result.stderr
    keys = [entry["idempotency_key"] for entry in read_stream(shared_redis, queue)]
    assert keys == [message.idempotency_key for message in committed]


# --- outage ------------------------------------------------------------------------------------


def test_relay_thread_survives_a_redis_restart_and_loses_nothing(
    pg_engine: Engine, tmp_path: Path, make_relay: MakeRelay
) -> None:
    """Redis stops mid-drain and comes back on the same port: the relay thread keeps running,
    each publish during the outage fails within the socket timeout, the same publisher's client
    reconnects by itself, and every committed message is delivered."""
    with throwaway.redis_server(tmp_path) as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        queue = "outage"
        committed: list[OutboxMessage] = []
        for _ in range(8):
            committed += stage(pg_engine, queue, 5)
            stage(pg_engine, queue, 1, commit=False)
        recorder = Recorder(from_url(f"{url}?socket_timeout=1"), pause_after=10)
        relay = make_relay(pg_engine, recorder, batch_size=5, poll_interval=0.05)
        reader = redis.Redis.from_url(url, decode_responses=True, socket_timeout=3)
        try:
            relay.start()
            assert recorder.paused.wait(WAIT), "the relay never confirmed 10 messages"
            # The relay is parked inside the pass that confirmed the 10th message: read what
            # Redis holds now, since this Redis keeps nothing across a restart.
            before = read_stream(reader, queue)
            server.stop()
            recorder.resume.set()
            assert recorder.failed.wait(WAIT), "no publish failed while Redis was down"
            assert relay.pending() > 0
            server.start()
            wait_until(lambda: relay.pending() == 0, "the relay to drain after the restart")
            after = read_stream(reader, queue)

            assert relay._thread is not None and relay._thread.is_alive()
        finally:
            reader.close()
            relay.stop()

    assert len(before) == 10
    delivered = [entry["idempotency_key"] for entry in before + after]
    assert unique_in_order(delivered) == [message.idempotency_key for message in committed]
    assert all(seconds < 3 for _error, seconds in recorder.failures), recorder.failures
    assert all(is_outage(error) for error, _s in recorder.failures), recorder.failures


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


def test_relay_marks_nothing_while_redis_is_unreachable_and_records_why(
    pg_engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """With Redis unreachable a pass is an outage: it publishes nothing, marks nothing, charges
    no row, and logs the publisher's sentence; tick() returns normally rather than raising."""
    messages = stage(pg_engine, "down", 3)
    publisher = from_url(f"redis://127.0.0.1:{free_port()}/0?socket_timeout=1")
    relay = make_relay(pg_engine, publisher)
    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        result = relay.run_pass()
    assert (result.published, result.failed, result.outage) == (0, True, True)
    assert relay.pending() == 3
    assert_uncharged(pg_engine, messages)
    [line] = logged(caplog, "relay.broker_unavailable")
    assert "did not confirm a batch of 3" in line
