"""NATS JetStream: a stream of the test's own on the shared server, one subject per queue.

The publisher URL's ``subject_prefix`` is the test's; :meth:`queue` adds the queue's subject to
the stream, so a refused queue is simply one whose subject no stream covers (JetStream answers
"no responders"). The stream is read back message by message (``get_msg``). The restartable
broker is a private nats-server whose JetStream store survives the restart.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, TypeVar

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg

from .. import throwaway
from ..conformance import ALL_FIELDS, PASSWORD, BadUrl, BrokerAdapter, Delivery, wait_for

NATS_URL = "nats://127.0.0.1:4222"
_T = TypeVar("_T")

HEADERS = {
    "id": "Outbox-Id",
    "job": "Outbox-Job",
    "queue": "Outbox-Queue",
    "idempotency_key": "Nats-Msg-Id",
    "max_attempts": "Outbox-Max-Attempts",
    "run_at": "Outbox-Run-At",
    "staged_at": "Outbox-Staged-At",
    "tenant_id": "Outbox-Tenant-Id",
    "traceparent": "traceparent",
    "enqueued_by": "Outbox-Enqueued-By",
}
"""Where each field travels (the payload is the input); ``ordering_key`` does not."""


def with_jetstream(url: str, action: Callable[[JetStreamContext], Awaitable[_T]]) -> _T:
    """Run ``action`` on a short-lived connection of the test's own (not the publisher's)."""

    async def run() -> _T:
        nc = await nats.connect(url, connect_timeout=3, allow_reconnect=False)
        try:
            return await action(nc.jetstream(timeout=5))
        finally:
            await nc.close()

    return asyncio.run(run())


def stored(url: str, stream: str) -> list[RawStreamMsg]:
    """Every message stored in ``stream``, by sequence."""

    async def read(js: JetStreamContext) -> list[RawStreamMsg]:
        state = (await js.stream_info(stream)).state
        if state.messages == 0:
            return []
        return [await js.get_msg(stream, seq) for seq in range(state.first_seq, state.last_seq + 1)]

    return with_jetstream(url, read)


def delivery(message: RawStreamMsg) -> Delivery:
    headers = message.headers or {}
    fields: dict[str, object] = {name: headers.get(header) for name, header in HEADERS.items()}
    fields["max_attempts"] = int(headers["Outbox-Max-Attempts"])
    fields["input"] = json.loads(message.data or b"")
    return Delivery(fields, headers["Nats-Msg-Id"], headers.get("traceparent"))


class _Stream:
    """A stream named after the test, covering ``<prefix>.<queue>`` for each queue handed out."""

    def __init__(self, server: str, options: str) -> None:
        run = uuid.uuid4().hex[:10]
        self.server = server
        self.name, self.prefix = f"SQLA_OUTBOX_TEST_{run}", f"sqla-outbox-test-{run}"
        self.url = self.cli_url = f"{server}?subject_prefix={self.prefix}.&{options}"
        self.subjects = [f"{self.prefix}.placeholder"]  # a stream needs one subject
        with_jetstream(server, lambda js: js.add_stream(name=self.name, subjects=self.subjects))

    def queue(self, label: str) -> str:
        if f"{self.prefix}.{label}" not in self.subjects:
            self.accept(label)
        return label

    def refused_queue(self) -> str:
        return f"refused-{uuid.uuid4().hex[:6]}"

    def accept(self, queue: str) -> None:
        self.subjects.append(f"{self.prefix}.{queue}")
        with_jetstream(
            self.server, lambda js: js.update_stream(name=self.name, subjects=self.subjects)
        )

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        subject = f"{self.prefix}.{queue}"

        def read() -> list[Delivery]:
            everything = stored(self.server, self.name)
            return [delivery(m) for m in everything if m.subject == subject]

        return wait_for(read, count, f"subject {subject!r}")

    def delete(self) -> None:
        with_jetstream(self.server, lambda js: js.delete_stream(self.name))


class _PrivateNats:
    def __init__(self, server: throwaway.BrokerProcess) -> None:
        self.server = server
        self.stream = _Stream(f"nats://127.0.0.1:{server.port}", "timeout=1")
        self.url = self.stream.url

    def queue(self, label: str) -> str:
        return self.stream.queue(label)

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        return self.stream.received(queue, count)

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server.start()


class NatsAdapter(BrokerAdapter):
    name = "nats"
    module = "sqla_outbox.publishers.nats_jetstream"
    docs_page = "nats.md"
    example_url = "nats://localhost:4222?subject_prefix=jobs."
    constructor = "nats_jetstream.NatsJetStreamPublisher('nats://localhost:4222')"
    fields = ALL_FIELDS - {"ordering_key"}
    deduplicates = True  # Nats-Msg-Id, within the stream's duplicate window
    outage_within = 4.0  # timeout=1
    unreachable_says = r"relay retries on a later pass"
    refusal_says = (
        r"No JetStream stream covers subject '[^']+'.* create a stream whose subjects include it"
    )
    bad_urls: ClassVar[Mapping[str, BadUrl]] = {
        "malformed": BadUrl.of("nats://h:port", "is malformed"),
        "scheme": BadUrl.of("http://h", "scheme 'http'"),
        "option twice": BadUrl.of("nats://h?timeout=1&timeout=2", "sets option 'timeout' twice"),
        "password": BadUrl.of(f"nats://user:{PASSWORD}@h?timeout=x", "timeout='x'", "user:***@"),
        "prefix without dot": BadUrl.of(
            "nats://h?subject_prefix=jobs", "subject_prefix must be", "ending with '.', got 'jobs'"
        ),
        "prefix with space": BadUrl.of("nats://h?subject_prefix=a b.", "got 'a b.'"),
        "prefix with wildcard": BadUrl.of("nats://h?subject_prefix=jobs.*.", "got 'jobs.*.'"),
        "zero timeout": BadUrl.of("nats://h?timeout=0", "timeout must be a positive", "got 0.0"),
        "infinite timeout": BadUrl.of(
            "nats://h?timeout=inf", "timeout must be a positive", "got inf"
        ),
        "text timeout": BadUrl.of("nats://h?timeout=soon", "timeout='soon'"),
        "stream name": BadUrl.of(
            "nats://h?stream=a.b", "stream must be a JetStream stream name", "got 'a.b'"
        ),
        "unknown option": BadUrl.of("nats://h?subjects=x", "unknown option 'subjects'"),
        "no host": BadUrl.of("nats://", "names no host"),
        "path": BadUrl.of("nats://h/jobs", "has a path '/jobs'"),
    }

    @contextmanager
    def sandbox(self) -> Iterator[_Stream]:
        try:
            stream = _Stream(NATS_URL, "timeout=3")
        except Exception as error:
            pytest.skip(f"NATS with JetStream is not reachable at {NATS_URL}: {error!r}")
        try:
            yield stream
        finally:
            stream.delete()

    def unreachable_url(self, port: int) -> str:
        return f"nats://relay:{PASSWORD}@127.0.0.1:{port}?timeout=1"

    @contextmanager
    def restartable(self, workdir: Path) -> Iterator[_PrivateNats]:
        with throwaway.nats_server(workdir) as server:
            yield _PrivateNats(server)


ADAPTER = NatsAdapter()
