"""Claiming ahead: the next claim travels to the database while the current one is published.

A relay pass is claim, publish, mark, one after another: while the broker works the database
waits, and while the database works the broker waits. With a broker that takes real time per
batch (a network round trip, a flush to disk, a confirm), :class:`ClaimAhead` sends the next
claim from a worker thread as soon as the current pass starts publishing, carrying the mark of
the pass before it, so the next pass can publish the moment this one ends.

Why it keeps every promise of the pass protocol:

* **Order.** The claim taken ahead is the claim the next pass would make once this one is
  published in full: its ordering guard counts this pass's rows as published (as it counts the
  rows of a mark riding on a claim), so it continues where this pass ends, in claim order, the
  rest of a transaction this pass split included.
* **Stop at failure.** That assumption holds only if this pass publishes everything. A pass that
  fails a message, meets a broker outage or is stopped hands the claim taken ahead back
  unpublished and uncharged (:meth:`ClaimAhead.hand_back`), and the next pass claims afresh, with
  the guard seeing what this pass left behind.
* **Fence and lease.** The claim taken ahead is fenced on its own token like any other. Its
  lease runs from the moment it was taken: if the pass before it took a third of the lease or
  more, it is renewed before it is published, and handed back if it was lost meanwhile
  (:meth:`ClaimAhead.take`); the renewal of its own pass then counts from that moment.
* **One connection at a time.** The worker uses the relay's held connection only while the
  pass publishes; the pass waits for it (:meth:`ClaimAhead.wait`) before it writes anything.

It pays only where publishing takes time the database can use: a relay claims ahead when its
publisher says so (``overlap = True`` on the bundled brokers where it pays, which the
``brokers`` benchmark checks per broker) or when ``Relay(overlap=True)`` asks for it.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor

from sqla_outbox.claims import Claimed, WriteBack
from sqla_outbox.stores import SqlStore

__all__ = ["ClaimAhead", "wants_overlap"]


def wants_overlap(publisher: object, overlap: bool | None) -> bool:
    """Whether a relay with ``publisher`` claims ahead: ``overlap`` when given, else what the
    publisher declares (``overlap = True``), else not."""
    if overlap is not None:
        return overlap
    return getattr(publisher, "overlap", False) is True


class ClaimAhead:
    """The next claim of one relay, taken on a worker thread while a pass publishes."""

    def __init__(self, statements: SqlStore, name: str) -> None:
        self._statements = statements
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future[Claimed] | None = None
        self.pending: Claimed | None = None
        """A claim taken ahead and not yet published: the next pass publishes it."""
        self.marked = True
        """Whether the mark sent with the last claim ahead was written (if it failed, the
        relay still owes it)."""

    def start(self, token: str, carried: WriteBack | None, in_flight: str) -> None:
        """Write ``carried``'s mark, then claim as if the claim ``in_flight`` (the one being
        published now) were already published, on the worker thread."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"{self._name}-ahead")
        self.marked = carried is None
        self._future = self._executor.submit(self._claim_ahead, token, carried, in_flight)

    def _claim_ahead(self, token: str, carried: WriteBack | None, in_flight: str) -> Claimed:
        if carried is not None:
            self._statements.write(carried)
            self.marked = True
        # A mark of nothing under the in-flight claim's token: the claim's ordering guard then
        # counts that claim's rows as published, as it does a mark riding on it, so the claim
        # continues exactly where the pass in flight ends (a transaction it splits included).
        return self._statements.claim(token, WriteBack(in_flight, []))

    @property
    def started(self) -> bool:
        """A claim was sent and not yet waited for."""
        return self._future is not None

    def wait(self) -> Claimed:
        """The claim sent by :meth:`start`; raises what its statement raised."""
        future, self._future = self._future, None
        if future is None:
            raise RuntimeError("no claim was sent ahead")
        return future.result()

    def keep(self, claimed: Claimed) -> None:
        """Keep ``claimed`` for the next pass (nothing is kept when it took no rows)."""
        self.pending = claimed if claimed.messages else None

    def take(self, renew_after: float | None = None) -> Claimed | None:
        """The claim the next pass publishes, if one was taken ahead.

        A claim that waited ``renew_after`` seconds or more (a third of the lease: the pass
        before it was slow) is renewed first. If that finds rows lost (its lease lapsed and
        another relay took them), it is handed back instead: publishing the rest could put them
        ahead of the lost rows of their transaction.
        """
        claimed, self.pending = self.pending, None
        if claimed is None or renew_after is None:
            return claimed
        if time.monotonic() - claimed.taken_at < renew_after:
            return claimed
        ids = [message.id for message in claimed.messages]
        renewed_at = time.monotonic()
        if self._statements.renew(claimed.token, ids) < len(ids):
            self._statements.release(claimed)
            return None
        claimed.taken_at = renewed_at
        return claimed

    def hand_back(self, claimed: Claimed | None = None) -> None:
        """Release ``claimed`` (default: the pending claim) unpublished and uncharged."""
        claimed = claimed if claimed is not None else self.take()
        if claimed is not None and claimed.messages:
            self._statements.release(claimed)

    def close(self) -> None:
        """Wait for a claim in flight and stop the worker thread."""
        if self._future is not None:
            with contextlib.suppress(Exception):  # a claim that failed holds no rows
                self.hand_back(self.wait())
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
