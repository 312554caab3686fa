"""Celery apps and the one task the Celery publisher tests run: ``tests.add_to_log``.

``app`` uses Redis (db 10 unless ``SQLA_OUTBOX_TEST_CELERY_BROKER`` says otherwise) and is what
``--publisher celery:tests.brokers.celery_app_for_tests:app`` names; ``amqp_app`` uses RabbitMQ.
:func:`app_on` makes one more, on any broker URL (a throwaway Redis, a port nobody listens on),
and returns the ``celery:`` URL that names it, since that URL can only name a module attribute.
Workers run inside the test process (``celery.contrib.testing.worker``), so the task records
each run here, and a test waits on :func:`wait_for_runs` with a bound instead of sleeping. A relay
in a subprocess imports this module only to send tasks by name; its list stays empty.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Celery

REDIS_URL = os.environ.get("SQLA_OUTBOX_TEST_CELERY_BROKER", "redis://127.0.0.1:6379/10")
AMQP_URL = os.environ.get("SQLA_OUTBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
TASK = "tests.add_to_log"

HEADER_NAMES = (
    "traceparent",
    "tenant_id",
    "enqueued_by",
    "idempotency_key",
    "outbox_id",
    "outbox_queue",
    "max_attempts",
    "run_at",
    "staged_at",
)
"""What the publisher puts in the headers; each is read back from ``self.request``."""

MISSING = "<missing>"


@dataclass(frozen=True)
class Run:
    """One execution of the task, as the worker saw it."""

    id: str
    queue: str | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    attributes: dict[str, Any]
    """``getattr(self.request, name)`` for each of :data:`HEADER_NAMES` (MISSING if absent)."""
    headers: dict[str, Any]
    """``self.request.headers``."""
    eta: str | None
    """``self.request.eta``: when the task was due, as Celery received it."""


_runs: list[Run] = []
_changed = threading.Condition()


def add_to_log(self: Any, *args: Any, **kwargs: Any) -> None:
    """Record this run: arguments, task id, the delivery queue and the outbox headers."""
    request = self.request
    run = Run(
        id=request.id,
        queue=(request.delivery_info or {}).get("routing_key"),
        args=tuple(args),
        kwargs=dict(kwargs),
        attributes={name: getattr(request, name, MISSING) for name in HEADER_NAMES},
        headers=dict(request.headers or {}),
        eta=request.eta,
    )
    with _changed:
        _runs.append(run)
        _changed.notify_all()


def runs_on(queue: str) -> list[Run]:
    """The runs of tasks delivered from ``queue``, in execution order."""
    with _changed:
        return [run for run in _runs if run.queue == queue]


def wait_for_runs(queue: str, predicate: Callable[[list[Run]], bool], timeout: float) -> list[Run]:
    """Block until ``predicate(runs_on(queue))`` holds or ``timeout`` passes; return the runs."""
    with _changed:
        _changed.wait_for(lambda: predicate(runs_on(queue)), timeout)
    return runs_on(queue)


def _make_app(name: str, broker: str) -> Celery:
    app = Celery(name, broker=broker, set_as_current=False)
    app.conf.update(
        # No remote control: no pidbox fanout queue, so a test leaves nothing behind it.
        worker_enable_remote_control=False,
        # Leave pytest's logging set-up alone.
        worker_hijack_root_logger=False,
        # A solo worker takes one message at a time, so execution order is publish order.
        worker_prefetch_multiplier=1,
        # No AMQP heartbeats: their timer lets the worker's event loop sleep up to 10 s at a
        # time, longer than the embedded worker is given to stop. Redis ignores it.
        broker_heartbeat=0,
    )
    app.task(bind=True, name=TASK)(add_to_log)
    return app


app = _make_app("sqla_outbox_tests", REDIS_URL)
amqp_app = _make_app("sqla_outbox_tests_amqp", AMQP_URL)

_made = itertools.count()


def app_on(broker: str) -> str:
    """A new app on ``broker``, set as an attribute of this module; the publisher URL naming it.

    For tests in this process only: a subprocess importing this module does not have it. The app
    lives as long as the process (an unused one holds no connection).
    """
    name = f"app_{next(_made)}"
    globals()[name] = _make_app(f"sqla_outbox_tests_{name}", broker)
    return f"celery:{__name__}:{name}"
