"""What a claim took and what a pass writes back: the data the relay and its store exchange.

The statements that produce and consume them run in a store (:mod:`sqla_outbox.stores`).

* A pass leaves its write-back to the next claim (:class:`WriteBack`): on PostgreSQL both
  travel in one statement, elsewhere in one transaction. That is the mark of a claim published
  in full, and in key order also the charges and parking of a pass with failures.
* What a claim took (:class:`Claimed`): its messages in claim order, with their failed
  attempts so far, and what it parked and left (:mod:`sqla_outbox.plan`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqla_outbox.message import OutboxMessage

__all__ = ["Claimed", "WriteBack"]


@dataclass(frozen=True, slots=True)
class WriteBack:
    """What a pass writes back, fenced on its claim's ``token``: the ``ids`` it published, the
    failures it charges, the rows it hands back (``released``) or parks behind the failed row
    each waits for (``held``: row -> that row).

    Built by :meth:`ClaimStatements.write_back`; written by :meth:`ClaimStatements.write` or,
    riding on it, by the next :meth:`ClaimStatements.claim`.
    """

    token: str
    ids: list[uuid.UUID]
    failures: list[dict[str, Any]] = field(default_factory=list)
    released: list[uuid.UUID] = field(default_factory=list)
    held: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)

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
    """Rows the claim parked behind a stuck row."""
    held: int = 0
    """Rows the claim left where they are: held by claims in flight, or past its batch."""
    unparked: int = 0
    """Rows the mark written with this claim freed: claimable from the next statement on."""
    crowded: bool = False
    """PostgreSQL's one-statement claim took nothing: something held a candidate back
    (:func:`~sqla_outbox.queries.fast_claim_stmt`)."""
    taken_at: float = field(default_factory=time.monotonic)
    """When the claim came back (``time.monotonic()``); its lease runs from about then."""

    def attempts_of(self, messages: Sequence[OutboxMessage]) -> list[int]:
        """The failed attempts before this claim of each of ``messages``, this claim's own.

        Found by identity (a pass hands back the objects it was given): one C-level map of the
        claim per call, where keying by id would hash every UUID of the claim in Python on every
        pass with a failure. A message that is not one of the claim's is refused, not guessed.
        """
        mine = dict(zip(map(id, self.messages), self.attempts, strict=True))
        try:
            return [mine[id(message)] for message in messages]
        except KeyError:
            raise ValueError(f"a message is not one of claim {self.token}'s") from None
