"""Routing: one relay, a publisher per queue.

An application that sends some queues to Celery and others to Kafka runs one relay with a
:class:`Router`: each message goes to the publisher of its ``queue``, or to ``default``. The
relay publishes a claim one message at a time, in claim order, and the router hands each one on
before it returns, so the order per transaction and per ordering key holds across routes: a
message on one broker is never sent before an earlier message of its transaction or key sent to
another.

A message whose queue has no route and there is no default is a failed publish of that message
(:class:`NoRouteError`, naming the queue and the routes there are): it is charged, retried and in
time dead-lettered like any other refusal, and it holds back what comes after it in its
transaction and key. Adding the route and retrying the dead letter delivers it in order.

The router publishes message by message: a route's ``publish_batch`` is not used, because a
batch would have to stop at every change of route to keep the order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sqla_outbox.errors import ArgumentTypeError, OutboxError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers import PublisherLike, publish_function

__all__ = ["NoRouteError", "Router"]


class NoRouteError(OutboxError, LookupError):
    """A message's queue has no route and the router has no default publisher."""


class Router:
    """A publisher that sends each message to the publisher of its queue.

    :param routes: queue name -> publisher (a :class:`~sqla_outbox.publishers.Publisher` or a
        callable taking one message).
    :param default: the publisher for every queue without a route; ``None`` (default) makes
        such a message a failed publish (:class:`NoRouteError`).

    ``close()`` closes every publisher once (one given for several queues is closed once).
    """

    def __init__(
        self, routes: Mapping[str, PublisherLike], default: PublisherLike | None = None
    ) -> None:
        if not isinstance(routes, Mapping):
            raise ArgumentTypeError(
                f"routes must be a mapping of queue name to publisher, got {routes!r}. Pass "
                'e.g. Router({"emails": celery_publisher}, default=kafka_publisher).'
            )
        self._publishers: list[object] = []
        self._routes: dict[str, Callable[[OutboxMessage], object]] = {}
        for queue, publisher in routes.items():
            if not isinstance(queue, str) or not queue:
                raise ArgumentTypeError(
                    f"every route's queue must be a non-empty string, got {queue!r}: the "
                    "router matches it with each message's queue."
                )
            self._routes[queue] = self._function(publisher)
        self._default = None if default is None else self._function(default)

    def _function(self, publisher: PublisherLike) -> Callable[[OutboxMessage], object]:
        function = publish_function(publisher)
        if all(publisher is not seen for seen in self._publishers):
            self._publishers.append(publisher)
        return function

    @property
    def queues(self) -> list[str]:
        """The queues with a route, sorted."""
        return sorted(self._routes)

    def publish(self, message: OutboxMessage) -> None:
        """Hand ``message`` to its queue's publisher (or the default) and return once that
        publisher has: what it raises is what this publish raises."""
        function = self._routes.get(message.queue, self._default)
        if function is None:
            routed = ", ".join(repr(queue) for queue in self.queues)
            raise NoRouteError(
                f"message {message.id} is on queue {message.queue!r}, which has no route "
                f"(routes: {routed}) and there is no default publisher. Add a route for it "
                "(--route QUEUE=SPEC, or Router({...})) or a default (--publisher), then "
                "retry the message once it is a dead letter."
            )
        function(message)

    def close(self) -> None:
        """Close each publisher that has ``close()``, once; every one is tried, and the first
        error is raised after."""
        first: BaseException | None = None
        for publisher in self._publishers:
            close = getattr(publisher, "close", None)
            if not callable(close):
                continue
            try:
                close()
            except Exception as error:  # close the others before raising
                first = first or error
        if first is not None:
            raise first
