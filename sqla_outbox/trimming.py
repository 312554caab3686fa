"""When a PostgreSQL claim leaves a transaction it would split for the next claim.

A claim that reaches its batch inside a transaction can take that transaction's first rows and
leave the rest (:func:`sqla_outbox.queries._whole_transactions` says when it does not). Alone, a
relay loses nothing by splitting: its next claim starts with the rest. Two relays that split
hand each other the rest, held by rows in flight, and once one claim split a transaction every
later one did: two relays drained at 0.6 of one. Ending claims on transaction boundaries keeps
them apart, at the price of smaller claims: a relay alone on a backlog with failures, whose
retried rows shift its claims off the boundaries, made 604 claims instead of 577 (and drained
5% slower) for no gain.

So a relay trims its claims only while another claim is about: for :data:`TRIM_FOR` seconds
after one of its claims found the outbox crowded (rows before its candidates it could not take:
another relay's claim, or a failed row's backoff, a dead letter, a parked row). Two relays find
each other's claims ahead of theirs on most claims; a relay alone finds none (only a stuck row,
for as long as it takes the full claim to park what it holds back).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["TRIM_FOR", "Trimming"]

TRIM_FOR = 5.0
"""Seconds a relay keeps ending its claims on transaction boundaries after a crowded claim."""


class Trimming:
    """Whether a relay's next claim ends on a transaction boundary (``on``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until = float("-inf")

    def crowded(self) -> None:
        """A claim found the outbox crowded: trim for the next :data:`TRIM_FOR` seconds."""
        self._until = self._clock() + TRIM_FOR

    @property
    def on(self) -> bool:
        """Whether claims trim now."""
        return self._clock() < self._until
