"""A relay's ear on PostgreSQL: ``LISTEN sqla_outbox`` on a dedicated connection.

**The connection is the engine's.** It is taken with ``engine.raw_connection()`` and at once
``detach()``-ed, SQLAlchemy's public way to make a connection through the pool and then own it
outside. So whatever shapes the engine's connections shapes this one: the URL's query and
``connect_args`` (``application_name``, TLS, ``options``), a ``creator`` function, ``do_connect``
event hooks (an IAM token fetched per connection), ``connect`` hooks. Detached, it leaves the pool
at once: a LISTENing session must never be handed to other code, and the pool gets its slot
back (the record returns empty and connects anew when next checked out), so the listener holds
no pool capacity. The one trap: taking it needs a free slot for an instant, so with the pool
exhausted the attempt waits up to the engine's ``pool_timeout`` and then counts as a failed
connect.

Each notification (one per committed enqueuing transaction, see :mod:`sqla_outbox.notify`) calls
the relay's ``wake()``. After every (re)connect the relay is woken once, since a commit may have
happened while nobody listened. A lost connection is logged and re-established with backoff,
:data:`RECONNECT_FIRST` doubling up to :data:`RECONNECT_MAX`; a connection that stayed up for
:data:`HEALTHY_PERIOD` resets it, so a drop after a healthy spell is retried as quickly as the
first one ever was, rather than after the delay earlier drops had built up. Meanwhile the relay's
``poll_interval`` sweep keeps everything moving, only slower.

Only psycopg 3 connections can be listened on here; with another driver the relay polls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from sqla_outbox.logs import error_line, log_event
from sqla_outbox.notify import CHANNEL

__all__ = [
    "HEALTHY_PERIOD",
    "RECONNECT_FIRST",
    "RECONNECT_MAX",
    "NotificationListener",
    "can_listen",
]

log = logging.getLogger("sqla_outbox.relay")

RECONNECT_FIRST = 0.25
"""Seconds before the first reconnect after a drop (and after any drop that follows a healthy
spell)."""

RECONNECT_MAX = 30.0
"""Seconds, the longest wait between reconnects; each failed one doubles the wait up to this."""

HEALTHY_PERIOD = 60.0
"""Seconds a LISTEN connection must stay up for its drop to count as a first one again."""

_CHECK_STOP_EVERY = 0.25  # seconds a notifies() wait lasts before looking at the stop flag


def can_listen(engine: Engine) -> bool:
    """True if ``engine`` is PostgreSQL through psycopg 3, which this listener supports."""
    return engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"


class NotificationListener:
    """Calls ``wake`` for every notification on the outbox channel until :meth:`stop`.

    :param healthy_period: seconds a connection must stay up to reset the reconnect backoff
        (default :data:`HEALTHY_PERIOD`).
    """

    def __init__(
        self,
        engine: Engine,
        wake: Callable[[], None],
        relay_id: str,
        *,
        healthy_period: float = HEALTHY_PERIOD,
    ) -> None:
        self._engine = engine
        self._wake = wake
        self._relay_id = relay_id
        self.healthy_period = healthy_period
        self.listening = threading.Event()
        """Set while a connection is LISTENing: every commit wakes the relay."""
        self.healthy = threading.Event()
        """Set once the current connection has listened for ``healthy_period``: its drop is
        retried after :data:`RECONNECT_FIRST`. Cleared when the connection is gone."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start listening in a daemon thread."""
        self._stop.clear()
        self.healthy.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"{self._relay_id}-listen", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and close the connection (returns within a fraction of a second)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _connect(self) -> Any:
        pooled = self._engine.raw_connection()
        connection = pooled.dbapi_connection
        pooled.detach()  # ours now, closed by _listen; the pool's record goes back empty
        return connection

    def _run(self) -> None:
        delay = RECONNECT_FIRST
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as error:
                if self.healthy.is_set():
                    delay = RECONNECT_FIRST
                self.healthy.clear()
                log_event(
                    log,
                    logging.WARNING,
                    "relay.listen_error",
                    relay=self._relay_id,
                    retry_in=delay,
                    error=error_line(error),
                )
                self._stop.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX)
        self.healthy.clear()

    def _listen(self) -> None:
        connection = self._connect()
        try:
            # A pooled connection comes back reset; the rollback is a no-op then, and makes sure
            # no transaction is open when autocommit (which psycopg refuses inside one) is set.
            connection.rollback()
            connection.autocommit = True
            connection.execute(f"LISTEN {CHANNEL}")
            self.listening.set()
            self._wake()
            healthy_at = time.monotonic() + self.healthy_period
            while not self._stop.is_set():
                for _notification in connection.notifies(timeout=_CHECK_STOP_EVERY, stop_after=1):
                    self._wake()
                if not self.healthy.is_set() and time.monotonic() >= healthy_at:
                    self.healthy.set()
        finally:
            self.listening.clear()
            connection.close()
