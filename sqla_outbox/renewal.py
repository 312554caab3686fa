"""Lease renewal: keep a healthy pass's claim alive however long publishing takes.

A claim is a lease of ``claim_lease`` seconds. Without renewal, a publisher slower than the
lease (a slow broker, a large batch) lets the lease lapse mid-pass: another relay claims the
same rows, both publish them, and the marks fight over the fence. So while a pass publishes, one
thread per relay renews the claim (``claimed_at = now``, fenced on the claim's token) about
every third of the lease.

What it guarantees, and the traps it closes:

* Renewal covers exactly one pass: :meth:`LeaseRenewal.begin` when publishing starts,
  :meth:`LeaseRenewal.end` before the pass settles. ``end()`` waits for a renewal already in
  flight, so no renewal of a finished claim can arrive after its marks.
* A renewal that touches fewer rows than the claim holds means the lease already lapsed and
  another relay took rows: the claim is **lost**, :attr:`Claim.lost` is set, and the pass must
  publish nothing more from it. An answer that arrives after ``end()`` is ignored: a clean
  completion settles the rows the renewal is fenced on, and reporting that as a loss would page
  someone for a finished pass.
* Terminal once closed: after :meth:`LeaseRenewal.close` (``Relay.stop()``) nothing is renewed
  again, for the pass in flight or any other.
* A database error during a renewal is logged and retried at the next interval; the lease is
  three intervals long, so one failed renewal costs nothing.

The thread starts with the first pass. It looks at least once an interval, and a pass wakes it
only when its claim comes due before that: a drain's many short passes do not switch threads
twice each. It ends once its looks have found no pass in flight for a minute, so a relay that is
only ticked now and then holds no thread. (A relay whose passes all fall between the looks may
see it end too: the next pass starts it again, one thread start a minute.)
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqla_outbox.logs import error_line, log_event

__all__ = ["Claim", "LeaseRenewal"]

log = logging.getLogger("sqla_outbox.relay")

_IDLE_EXIT = 60.0  # seconds without a pass after which the renewal thread ends


@dataclass(eq=False)
class Claim:
    """One claim being published: its fence token, its rows, and whether it was lost."""

    token: str
    ids: Sequence[uuid.UUID]
    lost: threading.Event = field(default_factory=threading.Event)


Renew = Callable[[str, Sequence[uuid.UUID]], int]
"""Renews ``(token, ids)`` and returns how many rows it touched."""


class LeaseRenewal:
    """Renews the claim of the pass in flight every ``interval`` seconds until it ends."""

    def __init__(self, renew: Renew, interval: float, name: str) -> None:
        self._renew = renew
        self.interval = interval
        self._name = name
        self._cond = threading.Condition()
        self._busy = threading.Lock()
        self._claim: Claim | None = None
        self._due = 0.0
        self._wakes_at = 0.0
        """When the waiting thread looks again (``time.monotonic()``): a claim due later
        need not wake it."""
        self._closed = False
        self._thread: threading.Thread | None = None

    def begin(self, claim: Claim, since: float | None = None) -> None:
        """Start renewing ``claim`` (the pass is about to publish it), first ``interval``
        seconds after ``since`` (``time.monotonic()`` when it was claimed; default now): a
        claim taken ahead of its pass is renewed on its own lease's schedule."""
        with self._cond:
            if self._closed:
                return
            self._claim = claim
            self._due = (time.monotonic() if since is None else since) + self.interval
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"{self._name}-renew", daemon=True
                )
                self._thread.start()
            elif self._due < self._wakes_at:
                # Only when the thread would look too late: waking it on every pass costs
                # two thread switches a pass (on the GIL), which a drain of short passes feels.
                self._cond.notify()

    def end(self) -> None:
        """Stop renewing the current claim; returns once no renewal of it is in flight.

        The thread is not woken: when it next looks, it finds no claim, or the next pass's.
        """
        with self._cond:
            self._claim = None
        with self._busy:
            pass

    def close(self) -> None:
        """Stop for good: nothing is renewed after this returns."""
        with self._cond:
            self._closed = True
            self._claim = None
            self._cond.notify()
        with self._busy:
            pass

    def _next(self) -> Claim | None:
        """Wait until the current claim is due for renewal; None to end the thread."""
        idle_since = time.monotonic()
        while not self._closed:
            now = time.monotonic()
            if self._claim is None:
                if now - idle_since >= _IDLE_EXIT:
                    return None
                # Look again within an interval, not at the idle exit: the next claim is then
                # due no sooner than the thread looks, and begin() need not wake it.
                self._wait(now, min(self.interval, idle_since + _IDLE_EXIT - now))
                continue
            idle_since = now
            if now >= self._due:
                return self._claim
            self._wait(now, self._due - now)
        return None

    def _wait(self, now: float, seconds: float) -> None:
        self._wakes_at = now + seconds
        self._cond.wait(seconds)

    def _run(self) -> None:
        while True:
            with self._cond:
                claim = self._next()
                if claim is None:
                    self._thread = None
                    return
                self._busy.acquire()
                self._due = time.monotonic() + self.interval
            try:
                touched: int | None = self._renew(claim.token, claim.ids)
            except Exception as error:
                touched = None
                log_event(
                    log,
                    logging.WARNING,
                    "relay.renew_failed",
                    claim=claim.token,
                    error=error_line(error),
                )
            finally:
                self._busy.release()
            if touched is not None and touched < len(claim.ids):
                with self._cond:
                    if self._claim is claim:  # after end() the pass settled: not a loss
                        claim.lost.set()
                        self._claim = None
                        log_event(
                            log,
                            logging.WARNING,
                            "relay.claim_lost",
                            claim=claim.token,
                            action="renew",
                            expected=len(claim.ids),
                            touched=touched,
                        )
