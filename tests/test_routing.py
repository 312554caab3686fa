"""Routing queues to publishers: ``sqla_outbox.publishers.Router`` and ``relay --route``.

The order per transaction and per ordering key holds across routes: a failure on one broker
holds back the later messages of its transaction and key bound for another; two relays
routing the same outbox publish each key in order, each message once.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine
from support import (
    MakeRelay,
    assert_one_clean_error,
    expire_backoffs,
    row,
    run_cli,
    transaction,
    url_of,
    wait_until,
)

import sqla_outbox as outbox
from sqla_outbox.errors import ArgumentTypeError
from sqla_outbox.publishers import NoRouteError, Router

HELPERS = "tests.publishers_for_tests"


class Broker:
    """One route's broker: records what it was sent into a sequence shared by every route (the
    order the relay published in), and refuses the first attempt of the ids in ``refuse``."""

    def __init__(self, name: str, sent: list[tuple[str, uuid.UUID]], lock: threading.Lock) -> None:
        self.name = name
        self.sent = sent
        self.lock = lock
        self.refuse: set[uuid.UUID] = set()
        self.closed = 0

    def publish(self, message: outbox.OutboxMessage) -> None:
        with self.lock:
            if message.id in self.refuse:
                self.refuse.discard(message.id)
                raise RuntimeError(f"{self.name} refused {message.id}")
            self.sent.append((self.name, message.id))

    def close(self) -> None:
        self.closed += 1


def brokers() -> tuple[Broker, Broker, list[tuple[str, uuid.UUID]]]:
    sent: list[tuple[str, uuid.UUID]] = []
    lock = threading.Lock()
    return Broker("emails", sent, lock), Broker("billing", sent, lock), sent


def enqueue(engine: Engine, *messages: tuple[str, str | None]) -> list[outbox.OutboxMessage]:
    """One committed transaction of ``(queue, ordering_key)`` messages, in order."""
    with transaction(engine) as session:
        return [
            outbox.enqueue(session, "job", {"n": n}, queue=queue, ordering_key=key)
            for n, (queue, key) in enumerate(messages)
        ]


def test_a_failure_on_one_route_holds_back_its_transaction_and_key_on_the_other(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """The first message of a transaction fails on the emails route: the later messages of its
    transaction and of its key (billing, on the other route) and what waits for those are held
    back; once it is retried, every message goes to its route in claim order."""
    emails, billing, sent = brokers()
    first = enqueue(engine, ("emails", "a"), ("billing", "a"), ("emails", "b"))
    second = enqueue(engine, ("billing", "b"))
    [free] = enqueue(engine, ("billing", "c"))
    emails.refuse.add(first[0].id)
    relay = make_relay(engine, Router({"emails": emails, "billing": billing}))

    result = relay.drain()

    assert result.failed
    # Key c waits for nobody: its message goes; everything else waits for the failed message.
    assert sent == [("billing", free.id)]
    expire_backoffs(engine)
    relay.drain()
    assert sent[1:] == [(m.queue, m.id) for m in [*first, *second]]
    assert row(engine, first[0]).attempts == 1


def test_a_queue_without_a_route_is_a_failed_publish_naming_it(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """With no default, a message of a queue that has no route is charged with an error naming
    its queue and the routes there are; with a default, it goes to the default."""
    emails, billing, sent = brokers()
    [lost] = enqueue(engine, ("reports", None))
    [kept] = enqueue(engine, ("emails", None))

    make_relay(engine, Router({"emails": emails})).drain()

    assert sent == [("emails", kept.id)]
    charged = row(engine, lost)
    assert charged.attempts == 1
    assert "NoRouteError" in charged.last_error
    assert "'reports'" in charged.last_error and "'emails'" in charged.last_error
    expire_backoffs(engine)
    make_relay(engine, Router({"emails": emails}, default=billing)).drain()
    assert sent == [("emails", kept.id), ("billing", lost.id)]


def test_two_relays_routing_one_outbox_keep_every_key_in_order(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Two relays, each with its own router over the same two brokers, drain 300 messages on
    two queues and six keys in transactions of three, with 2% failing once: every message is
    published once, and each key's messages in the order they were enqueued."""
    emails, billing, sent = brokers()
    staged: list[outbox.OutboxMessage] = []
    for start in range(0, 300, 3):
        staged += enqueue(
            pg_engine,
            *((("emails", "billing")[n % 2], f"key-{n % 6}") for n in range(start, start + 3)),
        )
    for message in staged[::50]:
        (emails if message.queue == "emails" else billing).refuse.add(message.id)
    relays = [
        make_relay(
            pg_engine,
            Router({"emails": emails, "billing": billing}),
            batch_size=20,
            relay_id=f"relay-{n}",
            retry_base=0.01,
            retry_max=0.01,
        )
        for n in range(2)
    ]
    for relay in relays:
        relay.start()
    try:
        wait_until(lambda: len(sent) >= len(staged), "every message published")
    finally:
        for relay in relays:
            relay.stop()

    ids = [message_id for _queue, message_id in sent]
    assert sorted(ids) == sorted(m.id for m in staged)  # each once
    position = {message_id: index for index, message_id in enumerate(ids)}
    for key in {m.ordering_key for m in staged}:
        of_key = [m.id for m in staged if m.ordering_key == key]
        assert sorted(of_key, key=position.__getitem__) == of_key


def test_the_router_closes_each_publisher_once() -> None:
    emails, billing, _sent = brokers()
    router = Router({"emails": emails, "more-emails": emails}, default=billing)
    router.close()
    assert (emails.closed, billing.closed) == (1, 1)
    assert router.queues == ["emails", "more-emails"]


@pytest.mark.parametrize(
    ("routes", "match"),
    [
        ([("emails", print)], "routes must be a mapping of queue name to publisher"),
        ({"": print}, "every route's queue must be a non-empty string, got ''"),
        ({"emails": 42}, "publisher must be a callable taking one OutboxMessage"),
    ],
)
def test_bad_routes_are_refused_with_the_fix(routes: Any, match: str) -> None:
    with pytest.raises(ArgumentTypeError, match=match):
        Router(routes)


def test_no_route_error_is_a_lookup_error() -> None:
    """Code that catches LookupError for a missing mapping entry catches this one too."""
    assert issubclass(NoRouteError, LookupError)


def test_relay_route_sends_each_queue_to_its_publisher(engine: Engine) -> None:
    """`relay --route billing=SPEC --publisher stdout`: both publishers print, in claim order;
    a malformed --route is one usage error naming the flag and the form."""
    staged = enqueue(engine, ("emails", "a"), ("billing", "a"), ("emails", None))

    result = run_cli(
        "relay",
        "--once",
        "--route",
        f"billing={HELPERS}:CountingPublisher",
        url=url_of(engine),
        publisher="stdout",
    )

    assert result.returncode == 0, result.stderr
    printed = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert [str(m.id) in line for m, line in zip(staged, printed, strict=True)] == [True] * 3
    assert '"job": "job"}' in printed[1]  # CountingPublisher's line: id and job only
    assert '"job": "job"}' not in printed[0]
    bad = run_cli("relay", "--once", "--route", "billing", url=url_of(engine), publisher="stdout")
    line = assert_one_clean_error(bad)
    assert "'--route'" in line and "QUEUE=SPEC" in line
