"""Celery: a task whose body runs once per message, through the inbox.

``inbox_task(app, sessions, consumer=...)`` registers ``fn(session, *args, **kwargs)`` as a
Celery task that, on each run, opens a session, :func:`~sqla_outbox.inbox.receive`\\ s the
task id (the Celery publisher sets it to the message's idempotency key), runs ``fn`` only the
first time and commits; a duplicate delivery returns ``None`` without running it. The task is
``acks_late``: the worker acknowledges the message after the task returned, so a worker that
dies before the commit leaves the message to be delivered again, and the key decides.

The task's name defaults to ``fn``'s module and name; give ``name=`` the outbox job's name
(what ``outbox.enqueue`` was called with) when they differ. Other keyword arguments go to
``app.task``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from sqla_outbox.inbox.receiving import DEFAULT_CONSUMER, receive

__all__ = ["inbox_task"]


def inbox_task(
    app: Any,
    sessions: Callable[[], Session],
    *,
    consumer: str = DEFAULT_CONSUMER,
    **options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """A decorator registering ``fn(session, *args, **kwargs)`` on ``app`` as a task run once
    per message (see the module docs); returns the Celery task."""

    def decorate(fn: Callable[..., Any]) -> Any:
        options.setdefault("name", f"{fn.__module__}.{fn.__name__}")
        options["bind"] = True
        options.setdefault("acks_late", True)

        def run(task: Any, *args: Any, **kwargs: Any) -> Any:
            with sessions() as session, session.begin():
                if not receive(session, task.request.id, consumer=consumer):
                    return None  # a duplicate: processed and committed before
                return fn(session, *args, **kwargs)

        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        return app.task(**options)(run)

    return decorate
