"""PostgreSQL through any SQLAlchemy driver: every step one autocommit statement.

What it does for speed, and why it is safe:

* A single statement runs in autocommit on one connection held across passes (a claim or a
  mark is one round trip instead of BEGIN + statement + COMMIT, and is atomic on its own). Any
  error drops the connection; the next step takes a fresh one from the pool.
* The claim locks, parks and stamps in one statement (:func:`~sqla_outbox.queries.claim_stmt`),
  and the previous pass's write-back travels inside it
  (:func:`~sqla_outbox.queries.mark_and_claim_stmt`): a pass is one round trip plus the
  publishing. A write-back on its own is one statement too (:func:`~queries.settle_stmt`).
* While the last claim found the outbox uncrowded, the fast claim serves; a crowded one hands
  over to the full claim within the same pass. Claims end on transaction boundaries only for a
  while after a crowded one (:mod:`sqla_outbox.trimming`).
* Timestamps come from the server's clock (``now()``), so relays on hosts with skewed clocks
  agree on leases and backoffs.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import Connection, Engine, Executable, Select, Update, text

from sqla_outbox import queries
from sqla_outbox.analyzing import StaleStatistics
from sqla_outbox.claims import Claimed, WriteBack
from sqla_outbox.logs import log_event
from sqla_outbox.stores.base import SqlStore
from sqla_outbox.sweeping import Swept
from sqla_outbox.trimming import Trimming

__all__ = ["PostgresStore"]

log = logging.getLogger("sqla_outbox.relay")


class PostgresStore(SqlStore):
    """The relay's statements on PostgreSQL, through SQLAlchemy Core (psycopg2, pg8000, or
    psycopg with its fast path off)."""

    can_claim_ahead = True

    def __init__(self, engine: Engine, **settings: Any) -> None:
        super().__init__(engine, **settings)
        order = self._order
        # The claims by (fast, what they carry: nothing, a mark, a whole write-back). A failed
        # pass's write-back rides on the claim in key order only (see mark_and_claim_stmt).
        self._carries = (None, "mark", "settle") if order == "key" else (None, "mark")
        self._claims: dict[tuple[bool, str | None], Select[Any] | Update] = {
            (fast, carries): (
                queries.claim_stmt("postgresql", order, fast=fast)
                if carries is None
                else queries.mark_and_claim_stmt(order, fast=fast, settle=carries == "settle")
            )
            for fast in (False, True)
            for carries in self._carries
        }
        self._crowded = False
        self._trimming = Trimming()
        self._settle = queries.settle_stmt()
        self._sweep = queries.sweep_stmt()
        self._analyze = queries.analyze_stmt()
        self._stale = StaleStatistics()
        self._session_before: dict[str, Any] = {}

    def can_carry(self, write_back: WriteBack) -> bool:
        """A mark always; a pass with failures in key order only (see
        :func:`~sqla_outbox.queries.mark_and_claim_stmt`)."""
        return write_back.mark_only or "settle" in self._carries

    def _params(self, **params: Any) -> dict[str, Any]:
        return params  # the statements read the server's clock

    def _retry_params(self, now: dt.datetime, backoff: dt.timedelta) -> dict[str, Any]:
        return {"delay": backoff}

    def sweep(self) -> Swept:
        """The whole sweep as one statement (:func:`~sqla_outbox.queries.sweep_stmt`), then
        ``ANALYZE`` when rows moved in thousands (:mod:`sqla_outbox.analyzing`)."""
        with self._transaction(statements=1) as conn:
            params = self._sweep_params()
            counts = self._rows(self._execute(conn, self._sweep, params))[0]
        swept = Swept(*counts[:3])
        self._advance(params, *counts[3:])
        self._stale.moved(swept.unparked + swept.woken + swept.parked)
        if self._stale.due():
            with self._transaction(statements=1) as conn:
                conn.execute(self._analyze)
            moved = self._stale.analysed()
            log_event(log, logging.INFO, "relay.analyzed", relay=self._relay_id, moved=moved)
        return swept

    # -- claim ---------------------------------------------------------------------------------

    def _claim_once(self, token: str, carried: WriteBack | None, params: dict[str, Any]) -> Claimed:
        fast = not self._crowded and self._window == self._batch_size
        trimming = self._trimming
        claimed = self._claim_with(token, carried, {**params, "whole": trimming.on}, fast=fast)
        if claimed.crowded:
            trimming.crowded()
        self._stale.moved(claimed.parked)
        if fast and claimed.crowded:
            # The fast claim took nothing (its write-back stands): the full claim sees what holds.
            unparked = claimed.unparked
            claimed = self._claim_with(token, None, {**params, "whole": True}, fast=False)
            claimed.unparked += unparked
        # Stay on the full claim while the outbox is crowded, unless this claim parked every
        # row it had to leave: what crowded it was stuck rows before them, now out of the way.
        parked_all = claimed.held > 0 and not claimed.held_unparked
        self._crowded = claimed.crowded and not parked_all
        return claimed

    def _claim_with(
        self, token: str, carried: WriteBack | None, params: dict[str, Any], *, fast: bool
    ) -> Claimed:
        header = 3
        carries = None
        if carried is not None:
            carries = "mark" if carried.mark_only else "settle"
            params = {**params, **self._write_params(carried, "previous_token", "previous_ids")}
            header += 2 if carried.mark_only else 6
        with self._transaction(statements=1) as conn:
            rows = self._rows(self._execute(conn, self._claims[fast, carries], params))
        counts = rows[0]
        if carried is not None:
            self._check_written(carried, counts)
        claimed = self._decode(token, rows if rows[0][header] is not None else [], header)
        claimed.parked, claimed.held, claimed.crowded = counts[header - 3 : header]
        if carried is not None:
            claimed.unparked = counts[1]
        return claimed

    # -- settle --------------------------------------------------------------------------------

    def write(self, write_back: WriteBack) -> None:
        """A mark alone as its statement; anything more as one :func:`~queries.settle_stmt`."""
        if write_back.mark_only:
            if write_back.ids:
                with self._transaction(statements=1) as conn:
                    self._mark_rows(conn, write_back.token, write_back.ids)
            return
        params = self._write_params(write_back, "token", "ids")
        with self._transaction(statements=1) as conn:
            counts = self._rows(self._execute(conn, cast("Executable", self._settle), params))
        self._check_written(write_back, counts[0])

    def _mark_rows(self, conn: Connection, token: str, ids: list[uuid.UUID]) -> None:
        # The mark unparks what its rows held back in the same statement (mark_published_stmt).
        result = self._execute(conn, self._mark, {"token": token, "ids": ids})
        self._check(token, "mark", expected=len(ids), touched=self._rows(result)[0][0])

    def _write_params(self, write_back: WriteBack, token: str, ids: str) -> dict[str, Any]:
        """The parameters of a write-back as one statement (``queries.settle_stmt``, or riding
        on a claim, ``queries.mark_and_claim_stmt``)."""
        params: dict[str, Any] = {token: write_back.token, ids: write_back.ids}
        if write_back.mark_only:
            return params
        failures = write_back.failures
        others = [*write_back.released, *write_back.held]
        unset = [None] * len(others)
        params.update(
            handed_ids=[*(f["failed_id"] for f in failures), *others],
            errors=[*(f["error"] for f in failures), *unset],
            delays=[*(f["delay"] for f in failures), *unset],
            deads=[*(f["dead"] for f in failures), *unset],
            parks=[False] * (len(failures) + len(write_back.released))
            + [True] * len(write_back.held),
        )
        return params

    def _check_written(self, write_back: WriteBack, counts: Sequence[Any]) -> None:
        """Log a lost claim unless a write-back's counts (``marked, unparked`` and, for more
        than a mark, ``charged, released, held_back``) touched every row it named."""
        token = write_back.token
        self._check(token, "mark", expected=len(write_back.ids), touched=counts[0])
        if write_back.mark_only:
            return
        self._check(token, "charge", expected=len(write_back.failures), touched=counts[2])
        handed_back = len(write_back.released) + len(write_back.held)
        self._check(token, "release", expected=handed_back, touched=counts[3] + counts[4])

    # -- connections -----------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, statements: int) -> Iterator[Connection]:
        """A connection for one pass step: autocommit for a single statement.

        Single statements reuse one connection held across passes, saving a pool checkout and
        an isolation-level reset per statement. Any error drops it; the next step takes a fresh
        one from the pool.
        """
        if statements != 1:
            with super()._transaction(statements) as conn:
                yield conn
            return
        with self._held_step(begin=False) as conn:
            yield conn

    def _open_held(self) -> Connection:
        held = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        # What the session had, restored before the connection goes back to the pool
        # (_reset_held): an application's engine may set either on connect, and RESET would
        # fall back to the server's default instead.
        try:
            # One round trip, as the SET it replaces: the settings as they were, then ours.
            self._session_before = held.execute(_SWAP_SESSION, _RELAY_SESSION).one()._asdict()
        except BaseException:
            held.close()
            raise
        return held

    def _reset_held(self, held: Connection) -> None:
        held.execute(_SET_SESSION, self._session_before)


_RELAY_SESSION = {"jit": "off", "timezone": "UTC"}
"""The relay's own session settings, on its held connection only.

``jit``: the claim's ordering guard is a recursive query over the window; its cost estimate
grows with the square of the window and crosses ``jit_above_cost`` at about 1,000 rows, where
compiling it takes 20-800 ms of a claim that runs in 7. (``force_generic_plan``, which would
save the half millisecond of planning, measured slower at 1,000-row batches.)

``TimeZone``: psycopg returns ``timestamptz`` values in the session's zone, and only a zone
named exactly ``UTC`` comes back as ``datetime.timezone.utc``, which the relay hands to
publishers as it is; under the common server default ``Etc/UTC`` (or any local zone) it had
to convert two timestamps per claimed row, about a tenth of a drain. The relay's statements
compare ``timestamptz`` values only, which no session zone changes.
"""
_SWAP_SESSION = text(
    "SELECT before.jit, before.timezone, set_config('jit', :jit, false), "
    "set_config('TimeZone', :timezone, false) FROM (SELECT current_setting('jit') AS jit, "
    "current_setting('TimeZone') AS timezone OFFSET 0) AS before"
)
"""Read the session's settings, then set ``:jit`` and ``:timezone``. The subquery (kept apart by
``OFFSET 0``) is computed before the outer row's ``set_config`` calls."""
_SET_SESSION = text(
    "SELECT set_config('jit', :jit, false), set_config('TimeZone', :timezone, false)"
)
