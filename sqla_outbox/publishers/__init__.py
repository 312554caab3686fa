"""Publishers: where a relay sends each committed message.

A publisher is a callable taking one :class:`~sqla_outbox.OutboxMessage`, or an object with a
``publish(message)`` method. Returning means "the broker has it"; raising means "not published",
and the relay stops the pass there so no later message overtakes it. A publisher may also have
``close()``, which the relay calls when it stops.

:func:`resolve_publisher` turns a command-line spec into a publisher: ``stdout``, or
``module:attribute`` naming a publisher object, a callable, or a class to instantiate with no
arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from sqla_outbox.errors import ArgumentTypeError
from sqla_outbox.message import OutboxMessage

__all__ = ["Publisher", "PublisherLike", "publish_function"]


@runtime_checkable
class Publisher(Protocol):
    """An object that hands one message to a broker and returns once the broker has it."""

    def publish(self, message: OutboxMessage) -> None:
        """Deliver ``message``; raise if it was not delivered."""


PublisherLike = Publisher | Callable[[OutboxMessage], object]
"""What :class:`~sqla_outbox.Relay` accepts: a :class:`Publisher` or a plain callable."""


def publish_function(publisher: PublisherLike) -> Callable[[OutboxMessage], object]:
    """The one-message callable behind ``publisher``, or ``TypeError`` saying what is expected."""
    method = getattr(publisher, "publish", None)
    if callable(method):
        return method  # type: ignore[no-any-return]
    if callable(publisher):
        return publisher
    raise ArgumentTypeError(
        f"publisher must be a callable taking one OutboxMessage or an object with a "
        f"publish(message) method, got {publisher!r}."
    )
