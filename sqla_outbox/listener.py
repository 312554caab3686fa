"""A relay's ear on PostgreSQL: ``LISTEN sqla_outbox`` on a dedicated connection.

The connection is made from the engine's dialect but kept outside its pool: it sits in LISTEN
for the relay's whole life, and a LISTENing session must never be handed to other code. Each
notification (one per committed enqueuing transaction, see :mod:`sqla_outbox.notify`) calls the
relay's ``wake()``. A lost connection is logged and re-established with capped backoff; after
every (re)connect the relay is woken once, since a commit may have happened while nobody
listened. Meanwhile the relay's ``poll_interval`` sweep keeps everything moving, only slower.

Only psycopg 3 connections can be listened on here; with another driver the relay polls.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from sqla_outbox.logs import log_event
from sqla_outbox.notify import CHANNEL

__all__ = ["NotificationListener", "can_listen"]

log = logging.getLogger("sqla_outbox.relay")

_CHECK_STOP_EVERY = 0.25  # seconds a notifies() wait lasts before looking at the stop flag
_MAX_BACKOFF = 30.0


def can_listen(engine: Engine) -> bool:
    """True if ``engine`` is PostgreSQL through psycopg 3, which this listener supports."""
    return engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"


class NotificationListener:
    """Calls ``wake`` for every notification on the outbox channel until :meth:`stop`."""

    def __init__(self, engine: Engine, wake: Callable[[], None], relay_id: str) -> None:
        self._engine = engine
        self._wake = wake
        self._relay_id = relay_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start listening in a daemon thread."""
        self._stop.clear()
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
        dialect = self._engine.dialect
        cargs, cparams = dialect.create_connect_args(self._engine.url)
        return dialect.connect(*cargs, **cparams)

    def _run(self) -> None:
        backoff = _CHECK_STOP_EVERY
        while not self._stop.is_set():
            try:
                self._listen()
                backoff = _CHECK_STOP_EVERY
            except Exception as error:
                log_event(
                    log,
                    logging.WARNING,
                    "relay.listen_error",
                    relay=self._relay_id,
                    retry_in=backoff,
                    error=f"{type(error).__name__}: {error}".splitlines()[0],
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    def _listen(self) -> None:
        connection = self._connect()
        try:
            connection.autocommit = True
            connection.execute(f"LISTEN {CHANNEL}")
            self._wake()
            while not self._stop.is_set():
                for _notification in connection.notifies(timeout=_CHECK_STOP_EVERY, stop_after=1):
                    self._wake()
        finally:
            connection.close()
