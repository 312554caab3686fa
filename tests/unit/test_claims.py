"""What a claim took: a failed message's attempts are found among the claim's own messages."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from sqla_outbox.claims import Claimed
from sqla_outbox.message import OutboxMessage

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)


def message(n: int) -> OutboxMessage:
    return OutboxMessage(
        id=uuid.UUID(int=n),
        job="send_receipt",
        queue="default",
        input={"n": n},
        idempotency_key=f"key-{n}",
        max_attempts=25,
        run_at=NOW,
        staged_at=NOW,
    )


def test_attempts_are_those_of_the_claims_own_message() -> None:
    """By identity: an equal message that is not one of the claim's is refused, not guessed."""
    messages = [message(1), message(2), message(3)]
    claimed = Claimed("t", messages, [0, 4, 1])
    assert claimed.attempts_of(messages) == [0, 4, 1]
    assert claimed.attempts_of([messages[2], messages[0]]) == [1, 0]
    stranger = message(2)
    assert stranger == messages[1]
    with pytest.raises(ValueError, match="is not one of claim t's"):
        claimed.attempts_of([messages[0], stranger])
