"""Retention: delete published rows once they are old enough, and nothing else.

A relay never deletes what it publishes: the row stays, ``published_at`` set, as the record of
what went out and when. Left alone, that history grows for ever. :func:`purge` deletes it::

    outbox.purge(engine, older_than=timedelta(days=7))      # -> how many rows it deleted

``sqla-outbox purge --url URL --older-than 7d`` does the same from cron, and
``Relay(..., retain_published=timedelta(days=7))`` lets a relay do it while it has nothing to
publish (:class:`BackgroundPurge`).

What it guarantees:

* Only **published** rows whose ``published_at`` is older than ``older_than`` are deleted. An
  unpublished row (due, scheduled, claimed, backing off) or a dead letter (unpublished by
  definition) never is, however old: the statement cannot match a NULL ``published_at``.
* The cutoff is fixed once, when the purge starts: ``now - older_than`` by the database's clock
  on PostgreSQL (the clock relays stamp ``published_at`` with), by this host's on SQLite, MySQL
  and MariaDB. Rows published while the purge runs are left to the next one, so a purge always
  ends.
* **Batches**, oldest first, each in a transaction of its own (``batch_size`` rows, one
  ``DELETE``), so no lock is held for long: relays lock only unpublished rows and ``enqueue``
  only inserts, so neither waits for a purge on PostgreSQL; on SQLite each batch holds the
  database's write lock for one short statement. On MySQL and MariaDB each batch runs at
  ``READ COMMITTED``, so that it locks only the rows it deletes: at InnoDB's default
  ``REPEATABLE READ`` its next-key locks over the ``published_at`` range it reads would make
  ``enqueue``'s inserts (whose NULL ``published_at`` sorts just before that range) wait for the
  batch. An interrupted purge loses only the batch in flight, which is rolled back; what it
  deleted before stays deleted.
* Purges running at the same time (two relays with ``retain_published``, an operator's) take
  different rows: each batch skips the rows another has locked (PostgreSQL). On MySQL and
  MariaDB a batch that meets rows another purge is deleting waits for that batch to commit.

What it does not do: give the space back to the operating system. PostgreSQL's (auto)vacuum makes
it reusable for new rows (InnoDB's purge thread does the same); an SQLite file keeps its size until
``VACUUM``. And it keeps no record of what it deleted: a consumer that deduplicates on
``idempotency_key`` must keep its own.

The trap: purging needs table version 3 (:mod:`sqla_outbox.versions`), whose index
``ix_outbox_published`` finds the oldest published rows without reading the others; on an older
table every batch would read the whole table. (It reads no later version's column, so a version
3 table is purged as a version 4 one is.) :func:`purge` refuses an older one with
:class:`~sqla_outbox.errors.SchemaVersionError` naming ``op.upgrade_outbox_table``, as relays do.
And on MySQL and MariaDB, ``READ COMMITTED`` writes cannot go to a statement-based binary log: on
a server with ``binlog_format=STATEMENT`` (MySQL 8 defaults to ``ROW``, MariaDB to ``MIXED``)
every batch fails with error 1665; use ``ROW`` or ``MIXED``.

Durations for the command line (``90s``, ``15m``, ``12h``, ``7d``, ``2w``) are read by
:func:`parse_duration`.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from sqla_outbox.clock import database_now
from sqla_outbox.errors import ConfigurationError
from sqla_outbox.logs import error_line, log_event
from sqla_outbox.preflight import check_outbox_table, operator_engine
from sqla_outbox.schema_errors import raise_if_missing_table
from sqla_outbox.stores.operating import operations_for

__all__ = [
    "PURGE_BATCH_SIZE",
    "PURGE_INTERVAL",
    "PURGE_PRIVILEGES",
    "PURGE_SCHEMA_VERSION",
    "ROUND_BATCHES",
    "ROUND_BATCH_SIZE",
    "BackgroundPurge",
    "format_duration",
    "parse_duration",
    "purge",
    "purge_batches",
    "purge_cutoff",
    "resolve_older_than",
    "resolve_purge_batch_size",
]

log = logging.getLogger("sqla_outbox.relay")

PURGE_PRIVILEGES = ("SELECT", "UPDATE", "DELETE")
"""What a purge needs on the outbox table (PostgreSQL): ``DELETE``, and ``UPDATE`` for the
``FOR UPDATE`` lock its batches take."""

PURGE_SCHEMA_VERSION = 3
"""The oldest table version :func:`purge` runs on: the first with ``ix_outbox_published``."""

PURGE_BATCH_SIZE = 10_000
"""Rows :func:`purge` deletes per transaction."""

PURGE_INTERVAL = 60.0
"""Seconds, at least, between two rounds of a relay's background purge once it has caught up."""

ROUND_BATCH_SIZE = 1_000
"""Rows per batch in a relay's background purge: a batch is a pause in publishing, kept short."""

ROUND_BATCHES = 10
"""Batches per round of a relay's background purge, so a backlog of history is worked off a round
at a time, with publishing in between, rather than all at once."""


# --- arguments ---------------------------------------------------------------------------------


def resolve_older_than(value: object, *, argument: str = "older_than") -> dt.timedelta:
    """``value`` if it is a positive ``timedelta``, else :class:`ConfigurationError` naming
    ``argument``."""
    if not isinstance(value, dt.timedelta) or value <= dt.timedelta(0):
        raise ConfigurationError(
            f"{argument} must be a positive datetime.timedelta such as timedelta(days=7), "
            f"got {value!r}."
        )
    return value


def resolve_purge_batch_size(value: object) -> int:
    """``value`` if it is a positive ``int``, else :class:`ConfigurationError`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(
            f"batch_size must be a positive whole number of rows such as {PURGE_BATCH_SIZE}, "
            f"got {value!r}."
        )
    return value


_DURATION = re.compile(r"([0-9]+)\s*([smhdw])", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_EXAMPLES = "e.g. 90s, 15m, 12h, 7d or 2w"


def parse_duration(text: str) -> dt.timedelta:
    """``text`` (a whole number and a unit: ``s``, ``m``, ``h``, ``d`` or ``w``) as a positive
    ``timedelta``, else :class:`ConfigurationError` in one sentence."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ConfigurationError(
            f"{text!r} is not a duration: write a whole number and a unit, {_EXAMPLES}."
        )
    try:
        seconds = int(match.group(1)) * _UNITS[match.group(2).lower()]
        duration = dt.timedelta(seconds=seconds)
    except (OverflowError, ValueError):  # past timedelta's 999,999,999 days, or int's digits
        raise ConfigurationError(
            f"{text!r} is longer than any outbox row can be old; write a duration {_EXAMPLES}."
        ) from None
    if not duration:
        raise ConfigurationError(f"{text!r} is not a positive duration; write one {_EXAMPLES}.")
    return duration


def format_duration(value: dt.timedelta) -> str:
    """``value`` the way :func:`parse_duration` reads it, in the largest whole unit up to days
    (``7d``, ``36h``, ``90s``)."""
    seconds = value.total_seconds()
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# --- purging -----------------------------------------------------------------------------------


def purge_cutoff(conn: Connection, older_than: dt.timedelta) -> dt.datetime | None:
    """``now - older_than`` by whose clock rules (:mod:`sqla_outbox.clock`); ``None`` when that
    is before the year 1 (nothing is that old)."""
    now = database_now(conn)
    try:
        return now - older_than
    except OverflowError:
        return None


def purge_batches(
    engine: Engine,
    cutoff: dt.datetime | None,
    batch_size: int,
    *,
    max_batches: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[int]:
    """Delete published rows published before ``cutoff``, ``batch_size`` at a time, each batch
    in a transaction of its own; yield how many each batch deleted.

    Ends after a batch that deleted fewer than ``batch_size`` (nothing more is due, or another
    purge holds the rest), after ``max_batches`` batches, or once ``should_stop()`` is true.
    On MySQL and MariaDB the batches run at ``READ COMMITTED`` (see the module docs).
    """
    if cutoff is None:
        return
    operations = operations_for(engine.dialect.name)
    batch_engine = operations.purge_engine(engine)
    batches = 0
    while max_batches is None or batches < max_batches:
        if should_stop is not None and should_stop():
            return
        with raise_if_missing_table(engine), batch_engine.begin() as conn:
            deleted = operations.purge_batch(conn, cutoff, batch_size)
        batches += 1
        yield deleted
        if deleted < batch_size:
            return


def purge(
    bind: Engine | str | URL,
    *,
    older_than: dt.timedelta,
    batch_size: int = PURGE_BATCH_SIZE,
    on_batch: Callable[[int], object] | None = None,
) -> int:
    """Delete the published rows published more than ``older_than`` ago; return how many.

    Batch by batch, each of ``batch_size`` rows in its own transaction, oldest first; never an
    unpublished row or a dead letter (see the module docs). The table is checked first, so a
    missing table, a role without ``DELETE`` or a table older than version 3 is one sentence
    with the fix.

    :param bind: an ``Engine`` or a database URL.
    :param older_than: a positive ``timedelta``, e.g. ``timedelta(days=7)``.
    :param batch_size: rows per transaction.
    :param on_batch: called with the rows each committed batch deleted, to show progress (a
        purge of much history takes minutes).
    """
    older_than = resolve_older_than(older_than)
    batch_size = resolve_purge_batch_size(batch_size)
    with operator_engine(bind) as engine:
        with raise_if_missing_table(engine), engine.begin() as conn:
            check_outbox_table(
                conn, PURGE_PRIVILEGES, needed_by="purge()", minimum=PURGE_SCHEMA_VERSION
            )
            cutoff = purge_cutoff(conn, older_than)
        deleted = 0
        for rows in purge_batches(engine, cutoff, batch_size):
            deleted += rows
            if on_batch is not None:
                on_batch(rows)
        return deleted


# --- a relay's background purge ------------------------------------------------------------------


class BackgroundPurge:
    """A relay's retention (``Relay(..., retain_published=...)``): purge rounds between passes.

    The relay calls :meth:`run_if_due` when it is idle (its last claim found nothing). A round
    deletes at most ``max_batches`` batches of ``batch_size`` rows published more than
    ``older_than`` ago, then the relay goes back to publishing. The first round comes at the
    first idle moment; after a round that deleted everything due, the next is ``interval``
    seconds later; after one that stopped with more to delete, at the next idle moment, so a
    backlog of history is worked off between passes and publishing always comes first. A relay
    that is never idle never purges: run ``sqla-outbox purge`` beside it then.

    Each round that deletes rows logs ``event=relay.purged`` (``rows``, ``older_than``, ``more``);
    a round that fails logs ``event=relay.purge_failed`` and is tried again ``interval`` seconds
    later: retention never stops a relay. :meth:`run_round` runs one round at once; ``behind``
    says whether the last round stopped with more to delete.
    """

    def __init__(
        self,
        engine: Engine,
        older_than: dt.timedelta,
        *,
        relay_id: str,
        interval: float = PURGE_INTERVAL,
        batch_size: int = ROUND_BATCH_SIZE,
        max_batches: int = ROUND_BATCHES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.older_than = resolve_older_than(older_than, argument="retain_published")
        self.relay_id = relay_id
        self.interval = interval
        self.batch_size = resolve_purge_batch_size(batch_size)
        self.max_batches = max_batches
        self._clock = clock
        self._next_round = -math.inf
        self.behind = False

    def __repr__(self) -> str:
        return f"<BackgroundPurge {self.relay_id} older_than={format_duration(self.older_than)}>"

    def due(self) -> bool:
        """Whether the next round may run now."""
        return self._clock() >= self._next_round

    def run_if_due(self, should_stop: Callable[[], bool] | None = None) -> bool:
        """Run a round if one is due; whether the next is due at once (this one stopped with more
        to delete). Never raises an ``Exception``: a failed round is logged and tried again
        ``interval`` seconds later. ``should_stop()`` true ends a round between two batches."""
        if not self.due():
            return False
        try:
            self.run_round(should_stop)
        except Exception as error:
            log_event(
                log,
                logging.WARNING,
                "relay.purge_failed",
                relay=self.relay_id,
                retry_in=self.interval,
                error=error_line(error),
            )
            return False
        return self.behind

    def run_round(self, should_stop: Callable[[], bool] | None = None) -> int:
        """One round now, whether due or not: how many rows it deleted. Database errors are
        raised (the next round is then ``interval`` seconds away)."""
        self._next_round = self._clock() + self.interval
        self.behind = False
        with self.engine.connect() as conn:
            cutoff = purge_cutoff(conn, self.older_than)
        counts: Sequence[int] = list(
            purge_batches(
                self.engine,
                cutoff,
                self.batch_size,
                max_batches=self.max_batches,
                should_stop=should_stop,
            )
        )
        more = self.behind = bool(counts) and counts[-1] == self.batch_size
        if more:
            self._next_round = -math.inf  # the next idle moment
        deleted = sum(counts)
        if deleted:
            log_event(
                log,
                logging.INFO,
                "relay.purged",
                relay=self.relay_id,
                rows=deleted,
                older_than=format_duration(self.older_than),
                more=more,
            )
        return deleted
