"""Publishers: where a relay sends each committed message.

A publisher is a callable taking one :class:`~sqla_outbox.OutboxMessage`, or an object with a
``publish(message)`` method. Returning means "the broker has it"; raising means "not published",
and the relay stops the pass there so no later message overtakes it. A publisher may also have
``close()``, which the relay calls when it stops.

What it raises tells the relay whose fault it was. A
:class:`~sqla_outbox.BrokerUnavailableError`, or an exception whose ``__cause__`` is one, is an
*outage*: the broker could not be reached or takes nothing, no message is charged an attempt,
and the relay backs off as a whole. Any other exception is a failure of *that message*: it is
charged an attempt, retried with backoff, and dead-lettered after ``max_publish_attempts``.
:mod:`sqla_outbox.publishers.outages` says where the bundled publishers draw the line;
``docs/publishers.md`` is the guide for writing one.

A publisher whose broker can confirm many messages at once (a Redis pipeline, AMQP publisher
confirms, a JetStream batch of acks) may also implement ``publish_batch(messages)``
(:class:`BatchPublisher`): the relay then hands it the whole pass, in claim order. It returns when
every message is confirmed; if only the first *k* were, it raises
:class:`~sqla_outbox.PublishError` (message *k* was refused) or
:class:`~sqla_outbox.BrokerUnavailableError` (the broker went away) with ``published=k``, so the
relay marks exactly those.

:func:`sqla_outbox.publishers.loader.resolve_publisher` turns a command-line spec into a
publisher: ``stdout``, ``module:attribute`` (a publisher object, a callable, or a class to
instantiate with no arguments), or a broker URL (:mod:`sqla_outbox.publishers.schemes`). What the
broker publishers share (hiding a URL's password, reading and checking URL options, reporting a
missing client library) lives in :mod:`sqla_outbox.publishers.urls`; each broker's delivery error
subclasses :class:`~sqla_outbox.errors.BrokerError`, and its outage error
:class:`~sqla_outbox.errors.BrokerUnavailableError`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from sqla_outbox.errors import ArgumentTypeError
from sqla_outbox.message import OutboxMessage

__all__ = [
    "BatchPublisher",
    "NoRouteError",
    "Publisher",
    "PublisherLike",
    "Router",
    "batch_function",
    "check_synchronous",
    "publish_function",
]


@runtime_checkable
class Publisher(Protocol):
    """An object that hands one message to a broker and returns once the broker has it."""

    def publish(self, message: OutboxMessage) -> None:
        """Deliver ``message``; raise if it was not delivered (``BrokerUnavailableError`` if the
        broker could not be reached)."""


@runtime_checkable
class BatchPublisher(Protocol):
    """A publisher that can deliver a whole pass and report how much of it was confirmed."""

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        """Deliver ``messages`` in order; after a confirmed prefix of *k*, raise
        ``PublishError(published=k)``, or ``BrokerUnavailableError(published=k)`` for an
        outage."""


PublisherLike = Publisher | Callable[[OutboxMessage], object]
"""What :class:`~sqla_outbox.Relay` accepts: a :class:`Publisher` or a plain callable."""


def publish_function(publisher: PublisherLike) -> Callable[[OutboxMessage], object]:
    """The one-message callable behind ``publisher``, or ``TypeError`` saying what is expected
    (also for an ``async def`` one, or an ``async def close``: see :func:`check_synchronous`)."""
    close = getattr(publisher, "close", None)
    if callable(close):
        check_synchronous(close, "publisher.close", "closes nothing", "client.close()")
    method = getattr(publisher, "publish", None)
    if callable(method):
        check_synchronous(method, "publisher.publish")
        return method  # type: ignore[no-any-return]
    if callable(publisher):
        check_synchronous(publisher, "publisher")
        return publisher
    raise ArgumentTypeError(
        f"publisher must be a callable taking one OutboxMessage or an object with a "
        f"publish(message) method, got {publisher!r}."
    )


def batch_function(publisher: object) -> Callable[[Sequence[OutboxMessage]], object] | None:
    """``publisher.publish_batch`` if it has one, else ``None``; ``TypeError`` if it is an
    ``async def``."""
    method = getattr(publisher, "publish_batch", None)
    if not callable(method):
        return None
    check_synchronous(method, "publisher.publish_batch")
    return method  # type: ignore[no-any-return]


def check_synchronous(
    function: Callable[..., object],
    name: str,
    does: str = "publishes nothing",
    call: str = "publish(message)",
) -> None:
    """Refuse ``function`` with ``TypeError`` if it is a coroutine function.

    The relay calls its publisher in its own thread and counts a return as "the broker has it".
    Called, an ``async def`` returns a coroutine that never runs: every message would be marked
    published and none sent, or (``close``) the client never flushed nor closed. (A plain
    function that returns an awaitable, such as a lambda around an async client, cannot be told
    apart here; the relay refuses its result instead, as a failed publish:
    :func:`sqla_outbox.publishing.refuse_awaitable`.)

    ``name``, ``does`` and ``call`` word the error for what ``function`` is: its name, what its
    unawaited coroutine fails to do, and the call to run on a loop instead.
    """
    if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 - an object with an async __call__
    ):
        raise ArgumentTypeError(
            f"{name} must be synchronous, got the coroutine function "
            f"{function!r}: the relay calls it in its own thread, and a coroutine that nobody "
            f"awaits {does}. Run it on an event loop from a plain function, e.g. "
            f"asyncio.run_coroutine_threadsafe({call}, loop).result() with a loop "
            "running in another thread, or use a bundled publisher (the Publishers page of the "
            "documentation)."
        )


# Last: routing builds on the names above (it imports this module).
from sqla_outbox.publishers.routing import NoRouteError, Router  # noqa: E402
