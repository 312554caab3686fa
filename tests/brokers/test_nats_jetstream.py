"""What only the NATS JetStream publisher promises; ``test_conformance.py`` runs the rest.

The shared scenarios (what arrives and in what order, bad URLs, outages, a subject no stream
covers, restarts) run against NATS there through ``adapters/nats_jetstream.py``. This file pins
JetStream's own behaviour: headers and subjects, deduplication on ``Nats-Msg-Id`` within the
duplicate window, ``Nats-Expected-Stream``, stream limits, acks that stop coming, and the
publisher's private event loop. Tests use the shared server on 127.0.0.1:4222, each with its
own stream and subject prefix (the stream is deleted afterwards); relays run on a fresh
PostgreSQL database per test.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RawStreamMsg
from sqlalchemy import Engine, update
from support import (
    WAIT,
    MakeRelay,
    stage,
)

import sqla_outbox as outbox
from sqla_outbox.errors import PublishError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers.nats_jetstream import (
    NatsJetStreamPublisher,
    NatsUnavailableError,
    from_url,
)

from .adapters.nats_jetstream import NATS_URL, with_jetstream
from .adapters.nats_jetstream import stored as stream_messages
from .conformance import TRACEPARENT
from .outage import is_outage

# --- helpers -----------------------------------------------------------------------------------


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


def test_a_message_is_its_input_as_json_on_the_prefixed_subject(
    stream: Stream, publishers: Callable[[str], NatsJetStreamPublisher]
) -> None:
    """The subject is the prefix then the queue, the payload the input as JSON and nothing else,
    Content-Type says so, and every other field is a header named as the docs say (the
    conformance suite reads them back by those names); unset ones are absent."""
    publisher = publishers(f"{NATS_URL}?subject_prefix={stream.subject_prefix}")
    full = message("emails", "full")._replace(tenant_id="acme", traceparent=TRACEPARENT)
    publisher.publish_batch([full, message("emails", "bare")])

    first, second = stream_messages(NATS_URL, stream.name)
    assert first.subject == f"{stream.prefix}.emails"
    assert json.loads(first.data or b"") == {"k": "full"}
    headers = first.headers or {}
    assert headers["Content-Type"] == "application/json"
    assert headers["Nats-Msg-Id"] == "full"
    assert headers["Outbox-Tenant-Id"] == "acme" and headers["traceparent"] == TRACEPARENT
    assert not {"traceparent", "Outbox-Tenant-Id"} & set(second.headers or {})


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


def test_from_url_reads_every_option() -> None:
    """Valid options land on the publisher, and make the subject."""
    publisher = from_url("tls://h:4443?subject_prefix=jobs.eu.&timeout=2.5&stream=JOBS")
    assert (publisher.subject_prefix, publisher.timeout, publisher.stream) == (
        "jobs.eu.",
        2.5,
        "JOBS",
    )
    assert publisher.subject_for(message("emails")) == "jobs.eu.emails"
    publisher.close()
