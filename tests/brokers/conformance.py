"""The broker conformance suite's seam: what an adapter tells the suite about one broker.

``test_conformance.py`` runs every scenario (its ``test_*`` functions taking ``broker``) once per
adapter in ``adapters/``, with the broker's name as the pytest id. The scenarios know nothing
about any broker: they stage messages, build the publisher from a URL the way the command line
does (:func:`~sqla_outbox.publishers.loader.resolve_publisher`), publish, and compare what the
adapter reads back with :meth:`~sqla_outbox.OutboxMessage.to_dict`. An adapter is the only place
that knows a broker: how to reach its live service, how to read back what it received, how to
make it refuse a message or go away. No scenario branches on which broker it runs against, only
on what the adapter declares (:attr:`BrokerAdapter.fields`, :attr:`BrokerAdapter.deduplicates`)
and on whether the publisher has ``publish_batch``.

Adding a broker is writing one module, ``adapters/<publisher module>.py``, that defines
``ADAPTER = YourAdapter()`` for a subclass of :class:`BrokerAdapter` (``adapters/kafka.py`` was
added that way, and nothing else changed); discovery (``adapters/__init__.py``) picks it up,
every scenario then runs against it, and the broker is done when they pass.
``docs/brokers/writing.md`` walks through it. What only one broker promises (NATS's duplicate
window, RabbitMQ's confirms, the webhook's status mapping, Celery's task arguments) stays in
that broker's own ``test_<module>.py``.

Every read-back is of real state (the stream, the queue, the requests an endpoint recorded),
polled with a deadline where the broker may lag, never a sleep.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from support import WAIT

from sqla_outbox.errors import BrokerUnavailableError, PublishError
from sqla_outbox.message import OutboxMessage

PASSWORD = "s3cret-pw"
"""Put in every URL an adapter builds that can carry a password; no error or log may show it."""

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

ALL_FIELDS = frozenset(OutboxMessage._fields)
"""Every field of a message, as :meth:`~sqla_outbox.OutboxMessage.to_dict` names them."""

REQUIRED_MISTAKES = ("malformed", "scheme", "option twice")
"""Keys every :attr:`BrokerAdapter.bad_urls` has: a URL that does not parse (a bad port), one of
another broker's scheme, and one that gives an option twice."""


@dataclass(frozen=True)
class Delivery:
    """One message as it arrived at the broker, read back by the adapter."""

    fields: dict[str, Any]
    """The message as a consumer rebuilds it: each of the adapter's :attr:`~BrokerAdapter.fields`
    under its ``to_dict`` name, with ``to_dict``'s types (``max_attempts`` an ``int``, ``input``
    decoded from JSON, times as ISO 8601 text); a field that did not arrive is ``None``."""
    message_id: str
    """The id the broker itself carries the message under, which consumers (or the broker)
    deduplicate on: RabbitMQ's ``message_id``, ``Nats-Msg-Id``, the ``Idempotency-Key`` header,
    the Celery task id; a Redis stream has none, so its ``idempotency_key`` field."""
    traceparent: str | None
    """The W3C trace context where a tracer's propagator for that broker reads it."""

    @property
    def key(self) -> str:
        """The idempotency key the message carries in its fields."""
        key: str = self.fields["idempotency_key"]
        return key


@dataclass(frozen=True)
class BadUrl:
    """A publisher URL ``from_url`` must refuse, and fragments its one sentence must contain."""

    url: str
    says: tuple[str, ...]

    @classmethod
    def of(cls, url: str, *says: str) -> BadUrl:
        return cls(url, says)


class Sandbox(Protocol):
    """A test's own corner of a live broker: fresh queues, cleaned up when the test ends."""

    url: str
    """A publisher URL (``--publisher``) that sends each message to its queue in this corner."""
    cli_url: str
    """The same URL as a ``sqla-outbox`` subprocess must spell it (usually ``url``)."""

    def queue(self, label: str) -> str:
        """A queue name unique to this test that the broker takes messages for (creating the
        queue, stream subject or key it needs); the same label gives the same name."""

    def refused_queue(self) -> str:
        """A queue name the reachable broker answers for and refuses every message of (no queue,
        stream or subject for it, a key of the wrong kind, a 4xx): a message failure."""

    def accept(self, queue: str) -> None:
        """Make the broker take messages for ``queue``, a :meth:`refused_queue`, from now on."""

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        """Every message that arrived for ``queue``, in arrival order, once at least ``count``
        have (polling with a deadline, for a broker whose read-back lags)."""


class Restartable(Protocol):
    """A broker of the test's own that it may stop and start again on the same address.

    A private server (redis-server, nats-server), an endpoint re-bound to its port, or a TCP
    proxy in front of a shared broker that must not be stopped.
    """

    url: str
    """A publisher URL with short timeouts, so a publish fails within the adapter's
    :attr:`~BrokerAdapter.outage_within` while the broker is stopped."""

    def queue(self, label: str) -> str:
        """As :meth:`Sandbox.queue`."""

    def received(self, queue: str, count: int = 0) -> list[Delivery]:
        """As :meth:`Sandbox.received`, including what arrived before a restart (an adapter
        whose broker forgets everything on restart keeps what it read when it stopped it)."""

    def stop(self) -> None:
        """Stop the broker: connections drop, new ones are refused."""

    def start(self) -> None:
        """Start it again on the same address; return once it takes connections."""


class BrokerAdapter(ABC):
    """Everything the conformance suite needs to know about one broker: the adapter protocol.

    To add a broker, subclass this in ``adapters/<publisher module>.py`` and set ``ADAPTER``.

    Class attributes to set:

    ``name``
        The pytest id (``redis``, ``kafka``).
    ``module``
        The publisher module (``sqla_outbox.publishers.kafka``). It must be registered for the
        broker's URL schemes in ``sqla_outbox/publishers/schemes.py``, import without its client,
        and have ``from_url(url)``.
    ``docs_page``
        The broker's page, ``docs/brokers/<page>.md``, which ``docs/publishers.md`` links.
    ``example_url``
        A valid URL of the broker's scheme; nothing connects to it.
    ``constructor``
        Python source building the publisher class directly, with the module imported under its
        own name (``kafka.KafkaPublisher('localhost:9092')``).
    ``fields``
        The ``to_dict`` fields that arrive with a message (:data:`ALL_FIELDS`, minus those the
        broker does not carry).
    ``deduplicates``
        ``True`` if the broker itself drops a second copy of a message with the same idempotency
        key (JetStream's ``Nats-Msg-Id``); the default, ``False``, expects both copies, with the
        same key.
    ``bad_urls``
        Label -> :class:`BadUrl`: each URL ``from_url`` refuses in one sentence containing the
        fragments. Has at least :data:`REQUIRED_MISTAKES`; put :data:`PASSWORD` in one whose
        scheme carries a password.
    ``outage_within``
        Seconds within which a publish to the unreachable or stopped broker fails.
    ``unreachable_says``
        A regular expression the outage error for an unreachable broker matches, and so the
        relay's log line about it (the cause, the broker's own wording).
    ``refusal_says``
        A regular expression the error for a message sent to :meth:`Sandbox.refused_queue`
        matches, and so the ``last_error`` the relay records.

    Methods to write: :meth:`sandbox`, :meth:`unreachable_url`, :meth:`restartable`. Each skips
    the test (``pytest.skip`` with the reason) when the live broker, its client library or a
    binary it needs is missing; on a machine that has them, nothing skips.
    """

    name: str
    module: str
    docs_page: str
    example_url: str
    constructor: str
    fields: frozenset[str] = ALL_FIELDS
    deduplicates: bool = False
    bad_urls: Mapping[str, BadUrl]
    outage_within: float
    unreachable_says: str
    refusal_says: str

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    @abstractmethod
    def sandbox(self) -> AbstractContextManager[Sandbox]:
        """A fresh :class:`Sandbox` on the shared, live broker, cleaned up on leaving."""

    @abstractmethod
    def unreachable_url(self, port: int) -> str:
        """A publisher URL for a broker on 127.0.0.1:``port``, where nothing listens, with
        :data:`PASSWORD` in it and timeouts short enough for :attr:`outage_within`."""

    @abstractmethod
    def restartable(self, workdir: Path) -> AbstractContextManager[Restartable]:
        """A running :class:`Restartable` broker, its files under ``workdir``, stopped on
        leaving."""


class MissingAdapter(BrokerAdapter):
    """Stands in for an adapter whose module could not be imported (its client is not
    installed): every scenario skips, saying why."""

    module = docs_page = example_url = constructor = unreachable_says = refusal_says = ""
    bad_urls: Mapping[str, BadUrl] = {}
    outage_within = 0.0

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.module = f"sqla_outbox.publishers.{name}"  # adapters are named after the module
        self.reason = reason

    def skip(self) -> None:
        pytest.skip(self.reason)

    def sandbox(self) -> AbstractContextManager[Sandbox]:
        raise AssertionError("skipped")

    def unreachable_url(self, port: int) -> str:
        raise AssertionError("skipped")

    def restartable(self, workdir: Path) -> AbstractContextManager[Restartable]:
        raise AssertionError("skipped")


# -- helpers for scenarios and adapters --------------------------------------------------------


def message(queue: str, **fields: Any) -> OutboxMessage:
    """A message on ``queue`` built directly, for a scenario that calls a publisher itself."""
    now = dt.datetime.now(dt.timezone.utc)
    made = OutboxMessage(uuid.uuid4(), "send_email", queue, {"n": 1}, uuid.uuid4().hex, 3,
                         now, now)  # fmt: skip
    return made._replace(**fields)


def expected(message: OutboxMessage, fields: Iterable[str]) -> dict[str, Any]:
    """What a consumer of a broker carrying ``fields`` rebuilds from ``message``."""
    staged = message.to_dict()
    return {name: staged[name] for name in fields}


def keys(deliveries: Iterable[Delivery]) -> list[str]:
    return [delivery.key for delivery in deliveries]


def unique_in_order(items: Iterable[str]) -> list[str]:
    """``items`` without repeats, first occurrence kept: what a deduplicating consumer sees."""
    return list(dict.fromkeys(items))


def raised(call: Callable[[], object]) -> Exception:
    """The exception ``call`` raises; the test fails if it returns."""
    try:
        call()
    except Exception as error:
        return error
    pytest.fail("the publish succeeded, but it was expected to fail")


def wait_for(read: Callable[[], list[Delivery]], count: int, what: str) -> list[Delivery]:
    """``read()`` once it returns at least ``count`` deliveries; fail after :data:`WAIT`."""
    deadline = time.monotonic() + WAIT
    while True:
        found = read()
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{what}: {len(found)} of {count} arrived"
        time.sleep(0.02)


class Recorder:
    """Wraps a publisher: records the failures it raised and can park the relay after a count.

    Once ``pause_after`` messages are confirmed, the call that confirmed them sets ``paused``
    and waits for ``resume`` before returning, so the test can act (stop the broker) while the
    relay is parked with a known number delivered. Built by :func:`recording`, which keeps the
    wrapped publisher's shape: a relay sees ``publish_batch`` only if the publisher has one.
    """

    def __init__(self, inner: Any, pause_after: int) -> None:
        self.inner = inner
        self.pause_after = pause_after
        self.confirmed = 0
        self.failures: list[tuple[BaseException, float]] = []
        self.paused = threading.Event()
        self.resume = threading.Event()
        self._lock = threading.Lock()

    def publish(self, message: OutboxMessage) -> None:
        self._call(self.inner.publish, message, 1)

    def close(self) -> None:
        self.inner.close()

    def outages(self) -> int:
        with self._lock:
            return len(self.failures)

    def _call(self, send: Callable[[Any], object], argument: Any, count: int) -> None:
        started = time.monotonic()
        try:
            send(argument)
        except Exception as error:
            done = (
                error.published if isinstance(error, PublishError | BrokerUnavailableError) else 0
            )
            with self._lock:
                self.confirmed += done
                self.failures.append((error, time.monotonic() - started))
            raise
        with self._lock:
            self.confirmed += count
            park = self.confirmed >= self.pause_after and not self.paused.is_set()
        if park:
            self.paused.set()
            self.resume.wait(WAIT)


class _BatchRecorder(Recorder):
    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        self._call(self.inner.publish_batch, messages, len(messages))


def recording(publisher: Any, pause_after: int) -> Recorder:
    """A :class:`Recorder` around ``publisher``, with ``publish_batch`` if it has one."""
    kind = _BatchRecorder if callable(getattr(publisher, "publish_batch", None)) else Recorder
    return kind(publisher, pause_after)
