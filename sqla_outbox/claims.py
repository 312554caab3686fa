"""What a claim took and what a pass writes back: the data the relay and its store exchange.

The statements that produce and consume them run in a store (:mod:`sqla_outbox.stores`).

* A pass leaves its write-back to the next claim (:class:`WriteBack`): on PostgreSQL both
  travel in one statement, elsewhere in one transaction. That is the mark of a claim published
  in full, and in key order also the charges and parking of a pass with failures.
* The claim's window (how many candidates it locks to find ``batch_size`` it may take) starts at
  ``batch_size`` and widens by the rows the last claim had to leave (held back by other claims),
  so a relay whose candidates all belong to a transaction another relay is publishing still
  finds the due work behind it, without every claim locking more rows than it takes
  (:func:`next_window`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqla_outbox.message import OutboxMessage

__all__ = ["Claimed", "WriteBack", "next_window"]

_MAX_WINDOW = 16
"""The widest claim window, in batches: past it a relay waits for the held rows instead."""


def next_window(window: int, batch_size: int, held: int) -> int:
    """The claim window after a claim that had to leave ``held`` rows of its window.

    Back to ``batch_size`` when nothing was held; otherwise doubled until it reaches past the
    held rows, up to :data:`_MAX_WINDOW` batches. Doubling keeps a relay's windows to a few
    multiples of its batch size: each is a claim text of its own (the window is written into
    the SQL, see :mod:`sqla_outbox.driver_sql`), prepared and planned once.
    """
    if not held:
        return batch_size
    window *= 2
    while window < batch_size + held:
        window *= 2
    return min(window, batch_size * _MAX_WINDOW)


@dataclass(frozen=True, slots=True)
class WriteBack:
    """What a pass writes back, fenced on its claim's ``token``: the ``ids`` it published, the
    failures it charges, the rows it hands back (``released``) or parks (``held``).

    Built by :meth:`ClaimStatements.write_back`; written by :meth:`ClaimStatements.write` or,
    riding on it, by the next :meth:`ClaimStatements.claim`.
    """

    token: str
    ids: list[uuid.UUID]
    failures: list[dict[str, Any]] = field(default_factory=list)
    released: list[uuid.UUID] = field(default_factory=list)
    held: list[uuid.UUID] = field(default_factory=list)

    @property
    def mark_only(self) -> bool:
        """Nothing to write but the mark: the pass published its whole claim."""
        return not (self.failures or self.released or self.held)


@dataclass(slots=True)
class Claimed:
    """What one claim took: its messages in claim order, with their failed attempts so far."""

    token: str
    messages: list[OutboxMessage]
    attempts: list[int]
    parked: int = 0
    held: int = 0
    unparked: int = 0
    """Rows the mark written with this claim freed: claimable from the next statement on."""
    crowded: bool = False
    """Something before the claimed rows was not claimable (see ``queries.claim_stmt``)."""
    taken_at: float = field(default_factory=time.monotonic)
    """When the claim came back (``time.monotonic()``); its lease runs from about then."""

    def attempts_of(self, messages: Sequence[OutboxMessage]) -> list[int]:
        """The failed attempts before this claim of each of ``messages``, this claim's own.

        Found by identity (a pass hands back the objects it was given): one C-level map of the
        claim per call, where keying by id hashed every UUID of the claim in Python on every
        pass with a failure. A message that is not one of the claim's is refused, not guessed.
        """
        mine = dict(zip(map(id, self.messages), self.attempts, strict=True))
        try:
            return [mine[id(message)] for message in messages]
        except KeyError:
            raise ValueError(f"a message is not one of claim {self.token}'s") from None

    @property
    def held_unparked(self) -> int:
        """Rows it had to leave that it did not park: they stay in the claim's index, held by
        rows in flight, and fill the next window again (parked rows left the index)."""
        return max(self.held - self.parked, 0)
