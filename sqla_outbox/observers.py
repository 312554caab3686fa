"""What a relay tells the code that watches it: one report per pass.

Metrics, debug logs and anything else that watches the relay subscribe with
``Relay.observe(observer)`` and receive a :class:`PassReport` after every pass that claimed
something, once it is settled (or, for a pass published in full, once its mark is handed to the
next claim). The relay itself never branches on who watches.

An observer runs on the relay's thread, inside the pass loop: it must be quick, and an exception
it raises is logged and swallowed (a broken metrics exporter must not stop publishing).

The errors in ``report.outcome`` carry their tracebacks whole during ``pass_done``: capture or
format them there. Once the pass is done the relay clears the local variables of their
tracebacks' finished frames (:meth:`~sqla_outbox.publishing.PassOutcome.drop_frames`), so a kept
error still formats but no longer holds the pass's messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishing import PassOutcome

__all__ = ["PassObserver", "PassReport"]


@dataclass(frozen=True, slots=True)
class PassReport:
    """One pass: who ran it, what it claimed, what became of it, and how long it took."""

    relay_id: str
    claimed: tuple[OutboxMessage, ...]
    outcome: PassOutcome
    dead: tuple[OutboxMessage, ...]
    """The failed messages that became dead letters in this pass."""
    seconds: float


class PassObserver(Protocol):
    """Receives a :class:`PassReport` after each pass that claimed something."""

    def pass_done(self, report: PassReport) -> None: ...
