"""The outbox's backlog at one instant: what ``outbox.status()`` and ``sqla-outbox status``
report.

An operator asks three questions of an outbox: how much is waiting and for how long (``pending``,
``due``, ``oldest_pending_age_seconds``), what is failing and what it holds back (``failing``,
``backing_off``, ``dead``, ``parked``, and the first failed rows in ``holding``), and who is
working on it (``relays``: the live claims per relay, and whether a claim has lapsed, which means
its relay is presumed dead and any relay may take its rows). Every figure is read in one
transaction and measured on the clock that rules there (:mod:`sqla_outbox.clock`), so the counts
add up and ages do not depend on this machine's clock.

The module is named for what it reads, not ``status``: the package exports the function
:func:`status`, which would hide a module of that name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, func, inspect, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from sqla_outbox.engines import hide_password
from sqla_outbox.preflight import STATUS_PRIVILEGES, checked_transaction
from sqla_outbox.settings import DEFAULT_CLAIM_LEASE, resolve_claim_lease
from sqla_outbox.stores.operating import operations_for

__all__ = [
    "HOLDING_SHOWN",
    "HoldingRow",
    "InboxStatus",
    "OutboxStatus",
    "RelayClaims",
    "read_status",
    "status",
]

HOLDING_SHOWN = 10
"""Failed rows a status lists (the first, in claim order); ``failing`` counts them all."""


@dataclass
class RelayClaims:
    """Unpublished rows one relay holds, over all its live claims (fence tokens).

    ``lapsed``: its oldest claim is older than the claim lease, so the relay is presumed dead and
    any relay may take those rows.
    """

    relay_id: str
    claims: int
    rows_held: int
    claim_age_seconds: float
    lapsed: bool


@dataclass
class HoldingRow:
    """A failed, unpublished row: it holds back the later rows of its transaction and key.

    ``state`` is ``dead`` (a dead letter: waits for ``retry_dead``/``discard_dead``),
    ``backing_off`` (``retry_at`` is still ahead) or ``due`` (its backoff is over: the next
    claim retries it). Timestamps are ISO 8601 text, so the object is JSON-ready as it is.
    """

    id: str
    job: str
    queue: str
    ordering_key: str | None
    attempts: int
    state: str
    retry_at: str | None
    dead_at: str | None
    last_error: str | None


@dataclass
class InboxStatus:
    """The consumers' inbox in the same database (:mod:`sqla_outbox.inbox`): how many keys it
    keeps and when the oldest was received (ISO 8601 text); what its retention works on."""

    keys: int
    oldest_received_at: str | None


@dataclass
class OutboxStatus:
    """The backlog at one instant; ``sqla-outbox status --json`` prints :meth:`to_dict`.

    ``due`` counts the rows a relay could claim now: not dead, not parked, past ``run_at`` and
    any retry backoff. ``oldest_pending_age_seconds`` is how long the longest-waiting due row
    has been due (since it was staged, or since its ``run_at`` if later; a row failing or dead
    counts, a row scheduled for later does not): what an alert on delivery lag compares.
    ``backing_off`` rows wait out a retry backoff; ``dead`` rows are dead letters; ``parked``
    rows are held back behind a failed or dead row. ``holding`` lists the first
    :data:`HOLDING_SHOWN` failed rows (of ``failing``), in claim order. ``url`` is the
    database's, password hidden.
    """

    url: str
    pending: int
    due: int
    oldest_pending_age_seconds: float | None
    failing: int
    backing_off: int
    dead: int
    parked: int
    claim_lease_seconds: float
    relays: list[RelayClaims] = field(default_factory=list)
    holding: list[HoldingRow] = field(default_factory=list)
    inbox: InboxStatus | None = None
    """The inbox, when its table is in the database (and readable)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, nested objects as dicts: what ``status --json`` prints."""
        return dataclasses.asdict(self)


def status(
    bind: Engine | str | URL, *, claim_lease: float | dt.timedelta = DEFAULT_CLAIM_LEASE
) -> OutboxStatus:
    """The outbox's backlog now: counts, ages, live claims per relay, and the failed rows that
    hold others back (see the module docs).

    :param bind: an ``Engine`` or a database URL (an engine is then made and disposed).
    :param claim_lease: the relays' claim lease (seconds or ``timedelta``); a claim older than
        it is reported ``lapsed``. Pass the value the relays run with.
    """
    lease = resolve_claim_lease(claim_lease)
    with checked_transaction(bind, STATUS_PRIVILEGES, "status()") as conn:
        return read_status(conn, lease)


def read_status(conn: Connection, lease: dt.timedelta) -> OutboxStatus:
    """:func:`status` on ``conn``, inside the caller's transaction (the CLI's, after its own
    start-up checks)."""
    now, counts, claims, holding = operations_for(conn.dialect.name).status(conn, HOLDING_SHOWN)
    by_relay: dict[str, RelayClaims] = {}
    for token, held, claimed_at in claims:
        relay_id = str(token).rpartition(":")[0] or str(token)  # tokens: <relay_id>:<16 hex>
        age = (now - claimed_at).total_seconds()
        entry = by_relay.setdefault(relay_id, RelayClaims(relay_id, 0, 0, age, False))
        entry.claims += 1
        entry.rows_held += held
        entry.claim_age_seconds = round(max(entry.claim_age_seconds, age), 3)
        entry.lapsed = entry.lapsed or age > lease.total_seconds()
    oldest = counts.oldest_due_at
    return OutboxStatus(
        url=hide_password(conn.engine.url),
        pending=counts.pending,
        due=counts.due,
        oldest_pending_age_seconds=None
        if oldest is None
        else round((now - oldest).total_seconds(), 3),
        failing=counts.failing,
        backing_off=counts.backing_off,
        dead=counts.dead,
        parked=counts.parked,
        claim_lease_seconds=lease.total_seconds(),
        relays=list(by_relay.values()),
        holding=[_holding_row(row, now) for row in holding],
        inbox=_inbox_status(conn),
    )


def _inbox_status(conn: Connection) -> InboxStatus | None:
    """The inbox's size and oldest key, or ``None`` without an inbox table or the right to read
    it (in a savepoint: a refusal must not end the status's transaction)."""
    from sqla_outbox.inbox.model import TABLE_NAME, inbox_table  # noqa: PLC0415 - optional part

    if not inspect(conn).has_table(TABLE_NAME):
        return None
    read = select(func.count(), func.min(inbox_table.c.received_at))
    try:
        with conn.begin_nested():
            keys, oldest = conn.execute(read).one()
    except DBAPIError:
        return None
    return InboxStatus(int(keys), None if oldest is None else oldest.isoformat())


def _holding_row(row: Any, now: dt.datetime) -> HoldingRow:
    if row.dead_at is not None:
        state = "dead"
    elif row.retry_at is not None and row.retry_at > now:
        state = "backing_off"
    else:
        state = "due"
    return HoldingRow(
        id=str(row.id),
        job=row.job,
        queue=row.queue,
        ordering_key=row.ordering_key,
        attempts=row.attempts,
        state=state,
        retry_at=None if row.retry_at is None else row.retry_at.isoformat(),
        dead_at=None if row.dead_at is None else row.dead_at.isoformat(),
        last_error=row.last_error,
    )
