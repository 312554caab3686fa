"""The staging INSERT: what an enqueuing transaction's commit writes."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Insert, insert

from sqla_outbox.message import OutboxMessage
from sqla_outbox.queries.terms import outbox_table

__all__ = ["stage_rows", "stage_stmt"]

_STAGE = insert(outbox_table)


def stage_stmt() -> Insert:
    """The INSERT that writes staged messages; executed with a list of rows (executemany)."""
    return _STAGE


def stage_rows(messages: list[OutboxMessage]) -> list[dict[str, Any]]:
    """Parameter rows for :func:`stage_stmt`, one per message, in the messages' order.

    A message's fields are the table's columns of the same names, so each row is the message
    as a dict; the rest of the columns (the lease, ``attempts``) take their defaults.
    """
    return [message._asdict() for message in messages]
