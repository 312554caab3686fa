"""Wake relays when work is committed, instead of making them poll for it.

Two paths, both best-effort (a relay still sweeps every ``poll_interval``, so a missed wake-up
costs latency, never a message):

* **Across processes, PostgreSQL only.** A statement-level ``AFTER INSERT`` trigger on the outbox
  table calls ``pg_notify('sqla_outbox', '')``. It runs inside the inserting transaction, so it
  costs the enqueue no extra round trip, and PostgreSQL delivers the notification only when that
  transaction commits (identical notifications of one transaction are folded into one). Relays
  ``LISTEN`` on a dedicated connection (see :mod:`sqla_outbox.stores.listener`). The trigger is
  created with the table (:mod:`sqla_outbox.ddl`).
* **Inside one process, any database.** After a session commits staged messages, every relay
  running in this process is woken directly.

LISTEN does not work through PgBouncer in transaction pooling mode; run relays with
``poll_only=True`` (``--poll-only``) there.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

__all__ = ["CHANNEL", "subscribe", "unsubscribe", "wake_local"]

CHANNEL = "sqla_outbox"
"""The PostgreSQL notification channel relays LISTEN on."""


class _Wakeable(Protocol):
    """What :func:`subscribe` accepts: anything with a ``wake()`` method."""

    def wake(self) -> None: ...


# Wake-up callbacks of the relays running in this process. Weak, so a relay that is garbage
# collected without stop() is simply forgotten.
_lock = threading.Lock()
_subscribers: weakref.WeakSet[_Wakeable] = weakref.WeakSet()


def subscribe(relay: _Wakeable) -> None:
    """Have ``relay.wake()`` called whenever this process commits staged messages."""
    with _lock:
        _subscribers.add(relay)


def unsubscribe(relay: _Wakeable) -> None:
    """Stop waking ``relay``."""
    with _lock:
        _subscribers.discard(relay)


def wake_local() -> None:
    """Wake every subscribed relay; called after a commit that wrote outbox rows."""
    if not _subscribers:
        return
    with _lock:
        relays = list(_subscribers)
    for relay in relays:
        relay.wake()
