"""PostgreSQL through psycopg 3: the PostgreSQL store, with psycopg's own speed tricks.

Everything driver-specific the library does lives here:

* Every relay statement is compiled once, when first sent, and sent as numbered driver SQL
  through a ``RawCursor`` (:func:`sqla_outbox.stores.psycopg_sql.execute`) with psycopg's own
  parameter adaptation, and the claim's rows are read straight from the cursor (uuid, jsonb -> dict,
  timestamptz): the claim is the one statement whose rows are many, and SQLAlchemy's per-value
  processing of them would be a large share of a drain's time.
* The staging INSERT of an enqueuing transaction is compiled once and sent as driver SQL too
  (:func:`insert_staged`); it is short enough for psycopg's own cache of converted queries.
* An idle relay LISTENs for the commit trigger's notifications
  (:mod:`sqla_outbox.stores.listener`).
* A claim whose ``jsonb`` Python cannot decode (a row written by hand, nested deeper than the
  recursion limit) is handed back at once and claimed again by a cursor that makes that value
  the row's :class:`~sqla_outbox.coltypes.UndecodableInput` (the relay then charges the row):
  from then on this store claims that way. That cursor costs a little on every value, so a
  store switches to it only once it has met a value that needs it.

None of it applies under a ``schema_translate_map`` (a string compiled in advance would name the
untranslated table): :func:`applies` says when it does.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, CursorResult, Dialect, Engine, Executable
from sqlalchemy.sql.expression import ClauseElement

from sqla_outbox import queries
from sqla_outbox.claims import Claimed, WriteBack
from sqla_outbox.logs import error_line, log_event
from sqla_outbox.message import OutboxMessage
from sqla_outbox.queries import stage_stmt
from sqla_outbox.stores import psycopg_sql
from sqla_outbox.stores.listener import NotificationListener
from sqla_outbox.stores.postgresql import PostgresStore

__all__ = ["PsycopgStore", "applies", "insert_staged"]

log = logging.getLogger("sqla_outbox.relay")

applies = psycopg_sql.applies


class PsycopgStore(PostgresStore):
    """The PostgreSQL store with its statements pre-compiled as psycopg driver SQL."""

    def __init__(self, engine: Engine, **settings: Any) -> None:
        super().__init__(engine, **settings)
        self._tolerant = False
        """Claims decode ``jsonb`` tolerantly (see the module docs): since one could not."""
        self._unclaim = queries.unclaim_stmt()
        statements = (
            *self._fast.values(),
            self._window,
            self._holders,
            self._stamp,
            self._park_rows,
            self._mark,
            self._renew,
            self._sweep,
            self._settle,
        )
        self._driver_sql: dict[int, ClauseElement] = {id(s): s for s in statements}
        """The statements sent as driver SQL, by ``id``: each compiled on its first execute."""
        self._precompiled: dict[int, psycopg_sql.Precompiled] = {}

    def listener(self, wake: Callable[[], None], relay_id: str) -> NotificationListener | None:
        """LISTEN for the commit trigger's notifications: a commit wakes the relay at once."""
        return NotificationListener(self.engine, wake, relay_id)

    def _rows(self, result: CursorResult[Any]) -> Sequence[Any]:
        # psycopg's own tuples, read from the cursor: no SQLAlchemy Row per claimed row.
        try:
            return result.cursor.fetchall()
        except (RecursionError, ValueError) as error:  # a loader: only jsonb can raise these
            raise _UndecodableError from error
        finally:
            result.close()

    def _claim_fast(self, token: str, carried: WriteBack | None, done: str) -> Claimed:
        try:
            return super()._claim_fast(token, carried, done)
        except _UndecodableError as undecodable:
            # The statement stands (its claim and the mark it carried): hand its rows back and
            # take them again, each undecodable value now its row's failure.
            self._tolerate(token, undecodable)
        return super()._claim_fast(token, None, done)

    def _planned(self, token: str, carried: WriteBack | None, done: str) -> Claimed:
        try:
            return super()._planned(token, carried, done)
        except _UndecodableError as undecodable:
            self._tolerate(None, undecodable)  # rolled back: nothing to hand back
        return super()._planned(token, carried, done)

    def _tolerate(self, token: str | None, undecodable: _UndecodableError) -> None:
        """From now on, read claims tolerantly (see the module docs); hand back the rows of
        claim ``token`` if it stands. Raises ``undecodable`` if claims were tolerant already."""
        if self._tolerant:
            raise undecodable
        self._tolerant = True
        log_event(
            log,
            logging.WARNING,
            "relay.undecodable_input",
            relay=self._relay_id,
            claim=token,
            error=error_line(undecodable.__cause__ or undecodable),
        )
        if token is not None:
            with self._transaction(statements=1) as conn:
                self._execute(conn, self._unclaim, {"token": token})

    def _execute(self, conn: Connection, statement: Executable, params: Any) -> CursorResult[Any]:
        key = id(statement)
        precompiled = self._precompiled.get(key)
        if precompiled is None:
            construct = self._driver_sql.get(key)
            if construct is None:
                return conn.execute(statement, params)
            # Compiled when first sent, not when the relay is built: compiling all of them
            # takes a noticeable part of a second of CPU, and a relay uses only some of them (a
            # relay alone never sends the claims for a crowded outbox, one without failures no
            # settle).
            precompiled = psycopg_sql.precompile(construct, self.engine.dialect)
            self._precompiled[key] = precompiled
        return psycopg_sql.execute(conn, precompiled, params, tolerant=self._tolerant)


class _UndecodableError(Exception):
    """A claimed row's ``jsonb`` could not be decoded by the connection's loader (the cause)."""


_stage_sql: weakref.WeakKeyDictionary[Dialect, psycopg_sql.Precompiled]
_stage_sql = weakref.WeakKeyDictionary()


def insert_staged(connection: Connection, rows: list[dict[str, Any]]) -> None:
    """INSERT staged ``rows`` (:func:`~sqla_outbox.queries.stage_rows`) as psycopg driver SQL,
    compiled once per dialect, with the input wrapped in ``Jsonb`` exactly as SQLAlchemy's own
    JSONB type would; ``None`` stays JSON ``null``, as it does there."""
    from psycopg.types.json import Jsonb  # noqa: PLC0415 - psycopg is this module's driver

    for row in rows:
        row["input"] = Jsonb(row["input"])
    dialect = connection.dialect
    stage = _stage_sql.get(dialect)
    if stage is None:
        stage = _stage_sql[dialect] = psycopg_sql.precompile(
            stage_stmt(), dialect, OutboxMessage._fields
        )
    connection.exec_driver_sql(stage.sql, rows)
