"""The NATS JetStream publisher against a real nats-server: acks, deduplication, outages.

Most tests use the shared server on 127.0.0.1:4222, each with its own stream and subject prefix
(the stream is deleted afterwards). The outage test starts a private nats-server with its own
JetStream store (``throwaway``) so it can stop it under a running relay and start it again on
the same port and store. Relays run on a fresh PostgreSQL database per test.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RawStreamMsg
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session
from support import (
    WAIT,
    MakeRelay,
    Recorder,
    free_port,
    publisher_error,
    run_cli,
    stage,
    url_of,
    wait_until,
)

import sqla_outbox as outbox
from sqla_outbox.errors import PublisherError, PublishError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers import nats_jetstream
from sqla_outbox.publishers.nats_jetstream import (
    NatsJetStreamPublisher,
    NatsUnavailableError,
    from_url,
)

from . import throwaway
from .outage import is_outage

NATS_URL = "nats://127.0.0.1:4222"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_T = TypeVar("_T")


# --- helpers -----------------------------------------------------------------------------------


def with_jetstream(url: str, action: Callable[[JetStreamContext], Awaitable[_T]]) -> _T:
    """Run ``action`` on a short-lived connection of the test's own (not the publisher's)."""

    async def run() -> _T:
        nc = await nats.connect(url, connect_timeout=3, allow_reconnect=False)
        try:
            return await action(nc.jetstream(timeout=5))
        finally:
            await nc.close()

    return asyncio.run(run())


def stream_messages(url: str, stream: str) -> list[RawStreamMsg]:
    """Every message stored in ``stream``, by sequence."""

    async def read(js: JetStreamContext) -> list[RawStreamMsg]:
        state = (await js.stream_info(stream)).state
        if state.messages == 0:
            return []
        return [await js.get_msg(stream, seq) for seq in range(state.first_seq, state.last_seq + 1)]

    return with_jetstream(url, read)


def msg_ids(messages: list[RawStreamMsg]) -> list[str]:
    return [(m.headers or {})["Nats-Msg-Id"] for m in messages]


@dataclass(frozen=True)
class Stream:
    """A test's stream: its name and the subject prefix it covers (``<prefix>.>``)."""

    name: str
    prefix: str

    @property
    def subject_prefix(self) -> str:
        return f"{self.prefix}."


def add_stream(url: str, *, covers: str = ">", **limits: Any) -> Stream:
    """A new file-backed stream with a two-minute duplicate window over a unique prefix.

    :param covers: the subjects under the prefix it stores (``<prefix>.<covers>``); all of them
        by default.
    :param limits: more stream configuration (``max_msgs=1``, ``discard=DiscardPolicy.NEW``).
    """
    run = uuid.uuid4().hex[:10]
    stream = Stream(name=f"SQLA_OUTBOX_TEST_{run}", prefix=f"sqla-outbox-test-{run}")

    async def add(js: JetStreamContext) -> None:
        await js.add_stream(
            name=stream.name,
            subjects=[f"{stream.prefix}.{covers}"],
            duplicate_window=120.0,
            **limits,
        )

    with_jetstream(url, add)
    return stream


def delete_stream(url: str, stream: Stream) -> None:
    async def delete(js: JetStreamContext) -> None:
        await js.delete_stream(stream.name)

    with_jetstream(url, delete)


@contextmanager
def silent_subscriber(url: str, subject: str) -> Iterator[None]:
    """A plain NATS subscription on ``subject`` that never replies, held open for the block.

    A publish to ``subject`` then gets neither an ack nor JetStream's "no responders", only
    silence: what a relay sees from a JetStream that stopped answering mid-pass.
    """
    ready, done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    async def hold() -> None:
        nc = await nats.connect(url, connect_timeout=3, allow_reconnect=False)
        try:
            await nc.subscribe(subject)  # no callback: messages wait unread, unanswered
            await nc.flush()
            ready.set()
            await asyncio.get_running_loop().run_in_executor(None, done.wait, WAIT)
        finally:
            await nc.close()

    def run() -> None:
        try:
            asyncio.run(hold())
        except BaseException as error:  # reported to the test below, not lost in the thread
            failures.append(error)
            ready.set()

    thread = threading.Thread(target=run, name="silent-subscriber", daemon=True)
    thread.start()
    try:
        assert ready.wait(WAIT) and not failures, f"the subscriber did not start: {failures}"
        yield
    finally:
        done.set()
        thread.join(WAIT)


@pytest.fixture
def shared_nats() -> str:
    """URL of the shared NATS server; skips the test unless it runs with JetStream."""

    async def check(js: JetStreamContext) -> None:
        await js.account_info()

    try:
        with_jetstream(NATS_URL, check)
    except Exception as error:
        pytest.skip(f"NATS with JetStream is not reachable at 127.0.0.1:4222: {error!r}")
    return NATS_URL


@pytest.fixture
def stream(shared_nats: str) -> Iterator[Stream]:
    """A stream of this test's own on the shared server, deleted afterwards."""
    made = add_stream(shared_nats)
    yield made
    delete_stream(shared_nats, made)


@pytest.fixture
def make_stream(shared_nats: str) -> Iterator[Callable[..., Stream]]:
    """:func:`add_stream` on the shared server with the test's own options; each stream is
    deleted afterwards."""
    made: list[Stream] = []

    def make(**options: Any) -> Stream:
        made.append(add_stream(shared_nats, **options))
        return made[-1]

    yield make
    for stream in made:
        delete_stream(shared_nats, stream)


@pytest.fixture
def publishers() -> Iterator[Callable[[str], NatsJetStreamPublisher]]:
    """``from_url`` for publishers used without a relay; each is closed when the test ends."""
    made: list[NatsJetStreamPublisher] = []

    def make(url: str) -> NatsJetStreamPublisher:
        made.append(from_url(url))
        return made[-1]

    yield make
    for publisher in made:
        publisher.close()


def message(queue: str, key: str | None = None, *, padding: int = 0) -> OutboxMessage:
    """A message on ``queue`` whose idempotency key (``Nats-Msg-Id``) is ``key``; ``padding``
    adds that many bytes to its input."""
    now = dt.datetime.now(dt.timezone.utc)
    input = {"k": key, "padding": "x" * padding} if padding else {"k": key}
    return OutboxMessage(uuid.uuid4(), "job", queue, input, key or str(uuid.uuid4()), 3,
                         now, now)  # fmt: skip


def loop_threads(publisher: NatsJetStreamPublisher) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"sqla-outbox-nats-{id(publisher):x}"]


# --- delivery ----------------------------------------------------------------------------------


def test_only_committed_messages_arrive_in_order_with_headers(
    pg_engine: Engine, stream: Stream, make_relay: MakeRelay
) -> None:
    """Committed messages are stored in enqueue order on <prefix><queue>: payload = the input as
    JSON, Nats-Msg-Id = the idempotency key, the other attributes and traceparent as headers
    (absent when None); rolled-back messages never reach the stream."""
    first = stage(pg_engine, "emails", 3, tenant_id="acme", enqueued_by="user:7",
                  traceparent=TRACEPARENT)  # fmt: skip
    stage(pg_engine, "emails", 2, commit=False)
    second = stage(pg_engine, "emails", 2)
    committed = first + second

    publisher = from_url(f"{NATS_URL}?subject_prefix={stream.subject_prefix}&timeout=5")
    relay = make_relay(pg_engine, publisher, batch_size=4)
    result = relay.drain()

    assert result.published == 5 and not result.failed
    stored = stream_messages(NATS_URL, stream.name)
    assert msg_ids(stored) == [m.idempotency_key for m in committed]
    for got, sent in zip(stored, committed, strict=True):
        assert got.subject == f"{stream.prefix}.emails"
        assert json.loads(got.data or b"") == sent.input
        headers = got.headers or {}
        assert headers["Outbox-Id"] == str(sent.id)
        assert headers["Outbox-Job"] == "send_email"
        assert headers["Outbox-Queue"] == "emails"
        assert headers["Outbox-Max-Attempts"] == str(sent.max_attempts)
        assert dt.datetime.fromisoformat(headers["Outbox-Staged-At"]) == sent.staged_at
        assert dt.datetime.fromisoformat(headers["Outbox-Run-At"]) == sent.run_at
        assert headers["Content-Type"] == "application/json"
    first_headers = stored[0].headers or {}
    assert first_headers["traceparent"] == TRACEPARENT
    assert first_headers["Outbox-Tenant-Id"] == "acme"
    assert first_headers["Outbox-Enqueued-By"] == "user:7"
    assert not {"traceparent", "Outbox-Tenant-Id"} & set(stored[-1].headers or {})


def test_the_same_message_published_twice_is_stored_once(
    stream: Stream, publishers: Callable[[str], NatsJetStreamPublisher]
) -> None:
    """Publishing one message twice (a crash between publish and mark) leaves one stream entry:
    JetStream deduplicates on Nats-Msg-Id within the duplicate window and acks both."""
    publisher = publishers(f"{NATS_URL}?subject_prefix={stream.subject_prefix}")
    once = message("emails", "key-once")
    publisher.publish(once)
    publisher.publish(once)
    publisher.publish_batch([once, message("emails", "key-other"), once])

    assert msg_ids(stream_messages(NATS_URL, stream.name)) == ["key-once", "key-other"]


def test_a_relay_that_crashed_before_marking_republishes_into_one_entry_each(
    pg_engine: Engine, stream: Stream, make_relay: MakeRelay
) -> None:
    """Rows published but never marked, their claim lapsed (a relay killed between publish and
    mark), are published again by the next relay; the stream holds each message exactly once."""
    committed = stage(pg_engine, "emails", 6)
    url = f"{NATS_URL}?subject_prefix={stream.subject_prefix}"
    assert make_relay(pg_engine, from_url(url), batch_size=4).drain().published == 6
    an_hour_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    with pg_engine.begin() as conn:
        conn.execute(update(outbox.OutboxRow).values(published_at=None, claimed_at=an_hour_ago))

    again = make_relay(pg_engine, from_url(url), batch_size=4).drain()

    assert again.published == 6 and not again.failed
    assert msg_ids(stream_messages(NATS_URL, stream.name)) == [m.idempotency_key for m in committed]


def test_a_subject_no_stream_covers_is_a_clear_error_and_stays_pending(
    pg_engine: Engine, shared_nats: str, make_relay: MakeRelay
) -> None:
    """JetStream's bare 'no responders' becomes one sentence naming the subject and asking for a
    stream that covers it; the relay records it and the row stays unpublished."""
    prefix = f"sqla-outbox-nostream-{uuid.uuid4().hex[:8]}"
    staged = stage(pg_engine, "emails", 1)
    relay = make_relay(pg_engine, from_url(f"{shared_nats}?subject_prefix={prefix}.&timeout=3"))

    assert relay.tick() == 0
    assert relay.pending() == 1
    with Session(pg_engine) as session:
        row = session.get(outbox.OutboxRow, staged[0].id)
        assert row is not None and row.last_error is not None
    assert f"No JetStream stream covers subject '{prefix}.emails'" in row.last_error
    assert "create a stream whose subjects include it" in row.last_error


def test_an_unsendable_message_stops_the_batch_before_anything_behind_it_is_sent(
    stream: Stream, publishers: Callable[[str], NatsJetStreamPublisher]
) -> None:
    """A queue that makes an invalid subject fails that message before it is sent, and nothing
    after it is sent, so no later message overtakes it; the error counts the acked prefix."""
    publisher = publishers(f"{NATS_URL}?subject_prefix={stream.subject_prefix}")
    batch = [message("emails", "a"), message("bad queue", "b"), message("emails", "c")]
    with pytest.raises(PublishError, match=r"Queue 'bad queue' .* not a valid NATS subject") as e:
        publisher.publish_batch(batch)

    assert e.value.published == 1 and not is_outage(e.value)
    assert msg_ids(stream_messages(NATS_URL, stream.name)) == ["a"]


def test_the_stream_option_makes_jetstream_refuse_another_stream(
    stream: Stream, publishers: Callable[[str], NatsJetStreamPublisher]
) -> None:
    """?stream=NAME sends Nats-Expected-Stream: a subject stored by a different stream is
    refused by JetStream, and the error says so."""
    publisher = publishers(
        f"{NATS_URL}?subject_prefix={stream.subject_prefix}&stream=SOME_OTHER_STREAM"
    )
    with pytest.raises(PublishError, match=r"JetStream refused message") as info:
        publisher.publish(message("emails"))
    assert info.value.published == 0 and not is_outage(info.value)
    assert stream_messages(NATS_URL, stream.name) == []

    right = publishers(f"{NATS_URL}?subject_prefix={stream.subject_prefix}&stream={stream.name}")
    right.publish(message("emails", "fits"))
    assert msg_ids(stream_messages(NATS_URL, stream.name)) == ["fits"]


def test_an_unreachable_server_fails_the_publish_within_timeout() -> None:
    """Nothing listening: publish raises NatsUnavailableError(published=0), an outage, after
    about ``timeout`` seconds instead of hanging the relay (nats-py alone would retry connecting
    forever)."""
    publisher = from_url(f"nats://127.0.0.1:{free_port()}?timeout=1")
    started = time.monotonic()
    try:
        with pytest.raises(NatsUnavailableError, match=r"relay retries on a later pass") as info:
            publisher.publish(message("emails"))
    finally:
        publisher.close()
    assert info.value.published == 0 and is_outage(info.value)
    assert time.monotonic() - started < 4


# --- outage or message failure -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "refusal"),
    [
        ({"max_msgs": 2, "discard": DiscardPolicy.NEW}, "maximum messages exceeded"),
        ({"max_msg_size": 2048}, "message size exceeds maximum allowed"),
    ],
    ids=["stream-full", "too-large"],
)
def test_a_stream_limit_refuses_the_message_not_the_server(
    make_stream: Callable[..., Stream],
    publishers: Callable[[str], NatsJetStreamPublisher],
    limits: dict[str, Any],
    refusal: str,
) -> None:
    """A full stream (``discard: new``; JetStream answers 503 with err_code 10077) and a message
    above ``max_msg_size`` (10054) are refusals of that message and its stream, not outages:
    PublishError with the acked prefix, JetStream's own words in the sentence."""
    stream = make_stream(**limits)
    publisher = publishers(f"{NATS_URL}?subject_prefix={stream.subject_prefix}")
    big = message("emails", "c", padding=4096)
    with pytest.raises(PublishError, match=refusal) as info:
        publisher.publish_batch([message("emails", "a"), message("emails", "b"), big])
    assert info.value.published == 2 and not is_outage(info.value)
    assert msg_ids(stream_messages(NATS_URL, stream.name)) == ["a", "b"]


def test_acks_that_stop_coming_are_an_outage_after_the_acked_prefix(
    make_stream: Callable[..., Stream], publishers: Callable[[str], NatsJetStreamPublisher]
) -> None:
    """Two messages are acked, then the third is met with silence (no ack, no "no responders"):
    after ``timeout`` the batch raises NatsUnavailableError with ``published=2``, so the relay
    marks exactly the acked prefix and charges nobody for the silence."""
    stream = make_stream(covers="stored")
    publisher = publishers(f"{NATS_URL}?subject_prefix={stream.subject_prefix}&timeout=1")
    batch = [message("stored", "a"), message("stored", "b"), message("silent", "c")]
    with (
        silent_subscriber(NATS_URL, f"{stream.prefix}.silent"),
        pytest.raises(NatsUnavailableError, match="did not acknowledge") as info,
    ):
        publisher.publish_batch(batch)
    assert info.value.published == 2 and is_outage(info.value)
    assert msg_ids(stream_messages(NATS_URL, stream.name)) == ["a", "b"]


def test_a_server_that_went_away_is_an_outage(tmp_path: Path) -> None:
    """A publisher whose server stops after it connected: the next publish fails within the
    timeout as NatsUnavailableError, confirming nothing, not as a failure of the message."""
    with throwaway.nats_server(tmp_path) as server:
        url = f"nats://127.0.0.1:{server.port}"
        stream = add_stream(url)
        publisher = from_url(f"{url}?subject_prefix={stream.subject_prefix}&timeout=1")
        try:
            publisher.publish(message("emails", "before"))
            server.stop()
            started = time.monotonic()
            with pytest.raises(NatsUnavailableError) as info:
                publisher.publish_batch([message("emails", "during")])
            elapsed = time.monotonic() - started
        finally:
            publisher.close()
    assert info.value.published == 0 and is_outage(info.value)
    assert elapsed < 4


def test_close_joins_the_loop_thread_and_a_later_publish_starts_afresh(
    stream: Stream,
) -> None:
    """The publisher's event-loop thread exists only between first use and close(); close() is
    idempotent, and a relay restarted with the same publisher gets a new loop."""
    publisher = from_url(f"{NATS_URL}?subject_prefix={stream.subject_prefix}")
    assert loop_threads(publisher) == []
    publisher.publish(message("emails", "one"))
    assert len(loop_threads(publisher)) == 1
    publisher.close()
    publisher.close()
    assert loop_threads(publisher) == []
    publisher.publish(message("emails", "two"))
    publisher.close()
    assert loop_threads(publisher) == []
    assert msg_ids(stream_messages(NATS_URL, stream.name)) == ["one", "two"]


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nats://h?subject_prefix=jobs", r"subject_prefix must be .* ending with '\.', got 'jobs'"),
        ("nats://h?subject_prefix=a b.", r"got 'a b\.'"),
        ("nats://h?subject_prefix=jobs.*.", r"got 'jobs\.\*\.'"),
        ("nats://h?timeout=0", r"timeout must be a positive.*got 0\.0"),
        ("nats://h?timeout=inf", r"timeout must be a positive.*got inf"),
        ("nats://h?timeout=soon", r"timeout='soon'"),
        ("nats://h?stream=a.b", r"stream must be a JetStream stream name .*got 'a\.b'"),
        ("nats://h?subjects=x", r"unknown option 'subjects'"),
        ("nats://h?timeout=1&timeout=2", r"sets option 'timeout' twice"),
        ("nats://h:port", r"is malformed"),
        ("nats://", r"names no host"),
        ("nats://h/jobs", r"has a path '/jobs'"),
        ("http://h", r"scheme 'http'"),
    ],
)
def test_from_url_rejects_a_bad_url_in_one_sentence(url: str, expected: str) -> None:
    """A malformed URL or bad option is a PublisherError: one sentence with the value and the
    fix, raised by from_url before any connection is attempted."""
    publisher_error(from_url, url, match=expected)


def test_from_url_hides_the_password_and_reads_every_option() -> None:
    """Errors never print the password; valid options land on the publisher."""
    with pytest.raises(PublisherError) as info:
        from_url("nats://user:s3cret@h?timeout=x")
    assert "s3cret" not in str(info.value) and "***" in str(info.value)
    publisher = from_url("tls://h:4443?subject_prefix=jobs.eu.&timeout=2.5&stream=JOBS")
    assert (publisher.subject_prefix, publisher.timeout, publisher.stream) == (
        "jobs.eu.",
        2.5,
        "JOBS",
    )
    assert publisher.subject_for(message("emails")) == "jobs.eu.emails"
    publisher.close()


def test_a_missing_client_is_reported_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without nats-py, from_url says which extra to install instead of an ImportError."""
    monkeypatch.setattr(nats_jetstream, "_CLIENT_INSTALLED", False)
    with pytest.raises(PublisherError, match=r'pip install "sqla-outbox\[nats\]"'):
        from_url(NATS_URL)


# --- command line ------------------------------------------------------------------------------


def test_cli_relay_once_publishes_to_jetstream(pg_engine: Engine, stream: Stream) -> None:
    """`sqla-outbox relay --once --publisher nats://...` delivers the committed messages."""
    committed = stage(pg_engine, "cli", 3)
    stage(pg_engine, "cli", 1, commit=False)
    publisher = f"{NATS_URL}?subject_prefix={stream.subject_prefix}&timeout=5"
    result = run_cli("relay", "--once", "--url", url_of(pg_engine), "--publisher", publisher)
    assert result.returncode == 0, result.stderr
    assert msg_ids(stream_messages(NATS_URL, stream.name)) == [m.idempotency_key for m in committed]


# --- outage ------------------------------------------------------------------------------------


def test_relay_thread_survives_a_nats_restart_and_stores_each_message_once(
    pg_engine: Engine, tmp_path: Path, make_relay: MakeRelay
) -> None:
    """nats-server stops mid-drain and restarts on the same port and store: the relay thread
    keeps running, each publish during the outage fails within the timeout, the client
    reconnects by itself, and the stream ends with every committed message exactly once."""
    with throwaway.nats_server(tmp_path) as server:
        url = f"nats://127.0.0.1:{server.port}"
        stream = add_stream(url)
        committed: list[OutboxMessage] = []
        for _ in range(8):
            committed += stage(pg_engine, "outage", 5)
            stage(pg_engine, "outage", 1, commit=False)
        publisher = from_url(f"{url}?subject_prefix={stream.subject_prefix}&timeout=2")
        recorder = Recorder(publisher, pause_after=10)
        relay = make_relay(pg_engine, recorder, batch_size=5, poll_interval=0.05)
        try:
            relay.start()
            assert recorder.paused.wait(WAIT), "the relay never confirmed 10 messages"
            server.stop()
            recorder.resume.set()
            assert recorder.failed.wait(WAIT), "no publish failed while NATS was down"
            assert relay.pending() > 0
            server.start()
            wait_until(lambda: relay.pending() == 0, "the relay to drain after the restart")

            assert relay._thread is not None and relay._thread.is_alive()
        finally:
            relay.stop()
        stored = stream_messages(url, stream.name)

    assert msg_ids(stored) == [m.idempotency_key for m in committed]
    assert all(seconds < 2 + 1 for _error, seconds in recorder.failures), recorder.failures
    assert all(is_outage(error) for error, _s in recorder.failures), recorder.failures
