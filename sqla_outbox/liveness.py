"""Liveness: is a relay's loop running, and has it reached the database lately?

This is what :meth:`Relay.is_alive() <sqla_outbox.Relay.is_alive>` answers, and what a health
endpoint serves: cheap (no I/O, two attribute reads and a clock read) and safe to call from any
thread while the loop runs.

**What counts as reaching the database.** A claim, mark or release whose transaction completed.
A statement that failed is not contact, nor is a connection that opened but could not run one.

**The bound.** A healthy loop touches the database at these intervals:

* idle, every ``poll_interval`` (sooner when woken);
* working through a backlog, once per pass, and a pass publishes for at most ``claim_lease`` (a
  pass that publishes longer lets its claim lapse to another relay, which is already trouble);
* with the broker down, a failed pass claims and hands back (contact), then waits at most the
  relay's ``max_backoff`` before the next one;
* in database-error backoff, never: that is the state the bound exists to report.

So the longest silence of a healthy loop is ``max(claim_lease, poll_interval, max_backoff)`` plus
the time its statements take. :func:`liveness_bound` allows ``claim_lease + max(poll_interval,
max_backoff)``, which covers that maximum with at least ``max_backoff`` (10 s by default) to spare
for slow statements, so it does not flap for a healthy relay; by default it is 40 s. A relay that
stops reaching the database is reported dead once the bound has passed since its last contact,
whatever it is doing meanwhile (retrying, or stuck).

The trap: a loop that has started but not yet completed its first statement is *not* alive. A
relay that cannot reach its database at boot never reports healthy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Liveness", "liveness_bound"]


def liveness_bound(claim_lease: float, poll_interval: float, max_backoff: float) -> float:
    """Seconds without database contact after which a running loop is no longer alive.

    All arguments in seconds; see the module docs for why this sum.
    """
    return claim_lease + max(poll_interval, max_backoff)


class Liveness:
    """Whether a loop is running and when it last reached the database.

    The loop calls :meth:`loop_started`, :meth:`reached_database` after each completed
    statement, and :meth:`loop_ended`; any thread may call :meth:`alive`. The contact time is
    written without a lock: one writer, and a reader racing it sees the old or the new value,
    both true a moment ago. Only the (rare) start and end of a loop take the lock.
    """

    __slots__ = ("_clock", "_lock", "_loops", "_reached")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._loops = 0
        self._reached: float | None = None

    def loop_started(self) -> None:
        """A loop begins; it is not alive until it reaches the database."""
        with self._lock:
            self._loops += 1
            self._reached = None

    def loop_ended(self) -> None:
        """A loop has ended (normally or not)."""
        with self._lock:
            self._loops -= 1

    def reached_database(self) -> None:
        """A statement of the loop completed, now."""
        self._reached = self._clock()

    def alive(self, bound: float) -> bool:
        """True if a loop runs and reached the database no more than ``bound`` seconds ago."""
        reached = self._reached
        return self._loops > 0 and reached is not None and self._clock() - reached <= bound
