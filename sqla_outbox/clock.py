"""Whose clock is "now", once: the database's on PostgreSQL, this host's UTC time elsewhere.

On PostgreSQL every instant a statement compares with is the server's ``now()`` (and
``now() + :interval``), so relays and operators on hosts with skewed clocks agree on leases,
backoffs, ages and cutoffs. SQLite has no server and one host; MySQL's and MariaDB's
``DATETIME(6)`` columns hold UTC without a zone whatever the server's ``time_zone``: there this
host's UTC time is passed to the statements as ``:now``, with the instants derived from it.

The statements' side of the rule is :func:`sqla_outbox.queries.terms.now` and its neighbours;
this module is the Python side: the parameters a statement needs (:func:`instants`) and the
current time as a statement would see it (:func:`database_now`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from sqla_outbox.coltypes import as_utc

__all__ = ["database_now", "instants", "server_clock"]

_DERIVED = {
    "lease": ("cutoff", -1),
    "park_ahead": ("park_after", 1),
    "wake_ahead": ("wake_before", 1),
    "stuck_ahead": ("stuck_after", 1),
}
"""Interval parameter -> the instant a statement takes instead where the host's clock rules,
and its sign: ``cutoff = now - lease``, ``park_after = now + park_ahead``, ..."""


def server_clock(dialect: str) -> bool:
    """Whether statements on ``dialect`` read the database's own clock."""
    return dialect == "postgresql"


def instants(dialect: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as a statement on ``dialect`` takes them: unchanged where the server's clock
    rules; elsewhere with ``now`` (this host's UTC time) added and each interval parameter
    (``lease``, ``park_ahead``, ``wake_ahead``, ``stuck_ahead``) replaced by the instant it
    stands for."""
    if server_clock(dialect):
        return params
    at = dt.datetime.now(dt.timezone.utc)
    params["now"] = at
    for interval, (instant, sign) in _DERIVED.items():
        if interval in params:
            params[instant] = at + sign * params.pop(interval)
    return params


def database_now(conn: Connection) -> dt.datetime:
    """The time a statement on ``conn`` compares with, as an aware UTC ``datetime``."""
    if server_clock(conn.dialect.name):
        return as_utc(conn.execute(sa.select(sa.func.now())).scalar_one())
    return dt.datetime.now(dt.timezone.utc)
