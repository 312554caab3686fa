"""MySQL and MariaDB: enqueue and drain against hand-written SQL on the same server.

Run with a MySQL URL: ``.venv/bin/python -m benchmarks --url
mysql+pymysql://root@127.0.0.1:3306/sqla_outbox_bench`` (or ``mariadb+pymysql://``). The suite
drops and recreates that database, and drops it at the end unless ``--keep``. Its workloads keep
the names of the PostgreSQL workloads they port (``enqueue_1``, ``enqueue_10``, ``drain``); the
others are PostgreSQL's only. Timing, interleaving, medians and the table are
:mod:`benchmarks.harness`'s, as for PostgreSQL; no row has a target.

**Enqueue** (workloads ``enqueue_1`` and ``enqueue_10``): the arms of :mod:`benchmarks.enqueue`
(ours, hand-written ``session.execute(insert(OutboxRow.__table__), rows)``, business row only),
unchanged: a new ``Session`` per transaction, one ``bench_orders`` row, the outbox write, commit.

**Drain** (workload ``drain``), per batch size, over :data:`DRAIN_ROWS` rows committed through
``outbox.enqueue`` ten per transaction (:func:`benchmarks.drain._prepare`), restored before every
timed drain, untimed (``TRUNCATE``, ``INSERT ... SELECT`` from ``outbox_template``, ``ANALYZE
TABLE``):

* **ours**: ``Relay(engine, lambda m: None, batch_size=b, relay_id="ours").drain()``
  (:func:`benchmarks.drain._drain_relay`): the store of ``sqla_outbox.stores.mysql``.
* **hand-written loop** (the baseline): PyMySQL, the connect arguments SQLAlchemy gives the same
  URL, ``READ COMMITTED`` set once on the connection. Per pass: ``BEGIN``; :data:`LOCK` (the
  message columns, ``ORDER BY staged_at, id LIMIT b FOR UPDATE SKIP LOCKED``); :data:`STAMP`
  (token and time by primary key); ``COMMIT``; each row to the no-op publisher as the driver
  returns it; one fenced :data:`MARK` in autocommit. What any at-least-once relay must do on
  MySQL, without ordering guarantees.
* **hand-written loop, decoded** (informative): the same loop handing the publisher what ours
  hands it (:func:`_decoded`: a ``uuid.UUID`` id, the JSON input parsed, aware UTC timestamps).
  Ours against it leaves out what any relay pays to turn the driver's bytes into values.

After the interleaved rounds, a few more drains of each side run with every PyMySQL round trip
timed by kind (:class:`RoundTrips`, untimed for the table): the ordering guard's share of ours,
and the share of the isolation-level round trips a checkout of the relay's READ COMMITTED
engine costs, are informative rows; the JSON has the whole split per pass.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import secrets
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL

import sqla_outbox as outbox
from benchmarks import enqueue
from benchmarks.drain import (
    BENCH_RELAY_ID,
    Drainer,
    _drain_relay,
    _noop,
    _prepare,
    interleave_drains,
)
from benchmarks.harness import (
    Context,
    Result,
    Scale,
    compare,
    create_tables,
    make_engine,
    restore_outbox,
)
from sqla_outbox import queries
from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.message import OutboxMessage

__all__ = [
    "BATCH_SIZES",
    "DRAIN_ROWS",
    "LOCK",
    "MARK",
    "STAMP",
    "MySQLContext",
    "RoundTrips",
    "drop_database",
    "is_mysql",
    "recreate_database",
    "run_drain",
    "run_enqueue_batch",
    "run_enqueue_single",
    "scale",
    "server_facts",
]

BATCH_SIZES = (100, 1000)
DRAIN_ROWS = 20_000
"""Rows of every drain (``--quick``: the PostgreSQL quick scale's 5,000)."""
PROFILED_DRAINS = 3
"""Drains per side and batch size with every round trip timed (1 with ``--quick``)."""

_COLUMNS = ", ".join(queries.MESSAGE_FIELDS)
LOCK = (
    f"SELECT {_COLUMNS} FROM outbox WHERE published_at IS NULL "
    "AND run_at <= UTC_TIMESTAMP(6) "
    "AND (claimed_at IS NULL OR claimed_at < UTC_TIMESTAMP(6) - INTERVAL 30 SECOND) "
    "ORDER BY staged_at, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
"""The baseline's lock and read: the same message columns as PostgreSQL's ``RAW_CLAIM``."""
STAMP = "UPDATE outbox SET claimed_by = %s, claimed_at = UTC_TIMESTAMP(6) WHERE id IN %s"
"""The baseline's stamp, by primary key, in the claim's transaction (PyMySQL renders the list
of ids as ``(..., ...)``)."""
MARK = (
    "UPDATE outbox SET published_at = UTC_TIMESTAMP(6) "
    "WHERE id IN %s AND claimed_by = %s AND published_at IS NULL"
)
"""The baseline's fenced mark, by primary key (``claimed_by`` has no index: see ``RAW_MARK``)."""


def is_mysql(url: URL) -> bool:
    """Whether ``url`` is a MySQL or MariaDB URL (``mysql+pymysql://``, ``mariadb+pymysql://``)."""
    return url.get_backend_name() in MYSQL_DIALECTS


def scale(quick: bool) -> Scale:
    """The PostgreSQL suite's scale, with drains of at most :data:`DRAIN_ROWS` rows."""
    base = Scale.quick() if quick else Scale.full()
    return dataclasses.replace(base, drain_rows=min(base.drain_rows, DRAIN_ROWS))


# --- the server -----------------------------------------------------------------------------------


def _connect(url: URL, *, autocommit: bool = True, database: bool = True) -> Any:
    """A PyMySQL connection with the connect arguments SQLAlchemy gives ``url`` (flags too);
    to the server alone, outside any database, with ``database=False``."""
    import pymysql  # noqa: PLC0415 - optional: only the MySQL suite needs it

    _args, params = sa.create_engine(url).dialect.create_connect_args(url)
    if not database:
        params.pop("database", None)
    return pymysql.connect(**params, autocommit=autocommit)


def _admin(url: URL, *statements: str) -> list[tuple[Any, ...]]:
    """Run ``statements`` on the server outside ``url``'s database; the last one's rows."""
    conn = _connect(url, database=False)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SET SESSION lock_wait_timeout = 60")
            for statement in statements:
                cursor.execute(statement)
            return list(cursor.fetchall())
    finally:
        conn.close()


def recreate_database(url: URL) -> None:
    """Drop ``url``'s database if it exists; create it with the outbox and ``bench_orders``."""
    if not url.database:
        raise SystemExit("python -m benchmarks: error: the MySQL URL must name a database")
    _admin(
        url,
        f"DROP DATABASE IF EXISTS `{url.database}`",
        f"CREATE DATABASE `{url.database}` CHARACTER SET utf8mb4",
    )
    create_tables(url)


def drop_database(url: URL) -> None:
    """Drop the suite's database."""
    _admin(url, f"DROP DATABASE IF EXISTS `{url.database}`")


_FACTS = (
    "version",
    "version_comment",
    "innodb_flush_log_at_trx_commit",
    "sync_binlog",
    "log_bin",
    "innodb_buffer_pool_size",
    "innodb_doublewrite",
    "tx_isolation",
    "transaction_isolation",
    "time_zone",
)


def server_facts(url: URL) -> dict[str, str]:
    """Server version and the settings that bound these numbers, for the report."""
    names = ", ".join(f"'{name}'" for name in _FACTS)
    rows = _admin(url, f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")
    return {str(name): str(value) for name, value in rows}


class MySQLContext(Context):
    """The workloads' :class:`~benchmarks.harness.Context` on MySQL and MariaDB."""

    CLEAR: ClassVar[tuple[str, ...]] = (
        "TRUNCATE outbox",
        "TRUNCATE bench_orders",
        "ANALYZE TABLE outbox",
    )
    RESTORE: ClassVar[tuple[str, ...]] = (
        "TRUNCATE outbox",
        "INSERT INTO outbox SELECT * FROM outbox_template",
        "ANALYZE TABLE outbox",
    )

    def raw(self, *, autocommit: bool = True) -> Any:
        """A plain PyMySQL connection to the benchmark database (new, server defaults)."""
        return _connect(self.url, autocommit=autocommit)

    def sql(self, *statements: str) -> None:
        conn = self.raw()
        try:
            with conn.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
                    cursor.fetchall()  # ANALYZE TABLE answers with rows
        finally:
            conn.close()


# --- enqueue --------------------------------------------------------------------------------------


def _run_enqueue(ctx: Context, messages: int, baseline_row: str) -> list[Result]:
    """:mod:`benchmarks.enqueue`'s arms (ours, hand-written, business only), interleaved."""
    unit = "1 msg" if messages == 1 else f"{messages} msgs"
    ctx.log(f"enqueue x{messages}: ours / hand-written / business only, interleaved")
    samples = enqueue._measure(ctx, enqueue._arms(ctx, messages))
    return [
        compare(f"enqueue {unit} vs {baseline_row}", "tx/s", samples, "ours", "hand-written"),
        compare(f"enqueue {unit} vs business row only", "tx/s", samples, "ours", "business only"),
    ]


def run_enqueue_single(ctx: Context) -> list[Result]:
    """One message per transaction against the hand-written INSERT and the order alone."""
    return _run_enqueue(ctx, 1, "hand-written INSERT")


def run_enqueue_batch(ctx: Context) -> list[Result]:
    """Ten messages per transaction against one hand-written executemany and the order alone."""
    return _run_enqueue(ctx, 10, "hand-written executemany")


# --- drain ----------------------------------------------------------------------------------------

_FIELD = {name: index for index, name in enumerate(queries.MESSAGE_FIELDS)}
_ID, _INPUT, _RUN_AT, _STAGED_AT = (_FIELD[n] for n in ("id", "input", "run_at", "staged_at"))


def _decoded(row: Sequence[Any]) -> OutboxMessage:
    """The driver's row as the values ours hands its publisher (the PostgreSQL baseline gets
    them from psycopg): the id a ``uuid.UUID``, the input parsed, the timestamps aware UTC."""
    values = list(row)
    values[_ID] = uuid.UUID(bytes=values[_ID])
    values[_INPUT] = json.loads(values[_INPUT])
    values[_RUN_AT] = values[_RUN_AT].replace(tzinfo=dt.timezone.utc)
    values[_STAGED_AT] = values[_STAGED_AT].replace(tzinfo=dt.timezone.utc)
    return OutboxMessage(*values)


def _drain_hand_written(
    ctx: Context, batch_size: int, *, decode: bool = False, clock: RoundTrips | None = None
) -> tuple[int, float]:
    """The baseline loop (module docs) on a new connection; ``clock`` times its round trips."""
    publish: Callable[[Any], object] = _decoded if decode else _noop
    conn = ctx.raw()
    try:
        with conn.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            if clock is not None:
                clock.wrap(conn)
            published = 0
            start = time.perf_counter()
            while True:
                token = f"raw:{secrets.token_hex(8)}"
                conn.begin()
                cursor.execute(LOCK, (batch_size,))
                claimed = cursor.fetchall()
                ids = [row[_ID] for row in claimed]
                if ids:
                    cursor.execute(STAMP, (token, ids))
                conn.commit()
                for row in claimed:
                    publish(row)
                if ids:
                    cursor.execute(MARK, (ids, token))
                published += len(claimed)
                if len(claimed) < batch_size:
                    break
            return published, time.perf_counter() - start
    finally:
        conn.close()


class RoundTrips:
    """Seconds and counts of the round trips of the PyMySQL connections it wraps, by kind.

    It replaces a connection's ``query``, ``begin``, ``commit`` and ``rollback`` (every way
    PyMySQL and SQLAlchemy talk to the server) with timed wrappers, on that one connection.
    """

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()

    def wrap(self, connection: Any) -> None:
        for name in ("query", "begin", "commit", "rollback"):
            setattr(connection, name, self._timed(name, getattr(connection, name)))

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        seconds, counts, clock = self.seconds, self.counts, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            kind = _kind(args[0]) if name == "query" else name
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[kind] += clock() - start
                counts[kind] += 1

        return timed


def _kind(sql: str | bytes) -> str:
    """Which step of a pass a statement is (the relay's, or the hand-written loop's)."""
    text = sql.decode(errors="replace") if isinstance(sql, bytes) else sql
    head = text.lstrip()[:40].upper()
    kinds = (
        ("SET SESSION TRANSACTION", "isolation level"),
        ("COMMIT", "isolation level"),  # SQLAlchemy's dialect commits after the SET
        ("WITH RECURSIVE", "ordering guard"),
        ("UPDATE OUTBOX SET CLAIMED_BY", "stamp"),
        ("UPDATE OUTBOX SET PUBLISHED_AT", "mark"),
        ("UPDATE OUTBOX SET PARKED=0", "unpark"),
        ("UPDATE OUTBOX SET PARKED=1", "park"),
        ("UPDATE OUTBOX,", "sweep"),
    )
    for prefix, kind in kinds:
        if head.startswith(prefix):
            return kind
    if head.startswith("SELECT") and "FOR UPDATE SKIP LOCKED" in text[-40:].upper():
        return "lock"
    return "other"


def _profile(ctx: Context, drainer: Callable[[RoundTrips], tuple[int, float]]) -> dict[str, Any]:
    """One drain (after an untimed restore) with every round trip timed: ms per pass by kind,
    and ``python``, the rest of the drain's time (the client's own work)."""
    restore_outbox(ctx)
    clock = RoundTrips()
    published, elapsed = drainer(clock)
    passes = max(clock.counts["lock"], 1)
    per_pass = {kind: 1000 * s / passes for kind, s in clock.seconds.most_common()}
    per_pass["python"] = 1000 * (elapsed - sum(clock.seconds.values())) / passes
    shares = {kind: 1000 * s / elapsed for kind, s in clock.seconds.items()}
    return {
        "published": published,
        "seconds": elapsed,
        "passes": passes,
        "ms_per_pass": per_pass,
        "round_trips_per_pass": {k: n / passes for k, n in clock.counts.items()},
        "share_per_mille": shares,
    }


def _profiled_relay(ctx: Context, batch_size: int) -> Callable[[RoundTrips], tuple[int, float]]:
    def drain(clock: RoundTrips) -> tuple[int, float]:
        engine = make_engine(ctx.url)  # its own engine: the shared one stays unwrapped
        event.listen(
            engine, "connect", lambda dbapi_connection, _record: clock.wrap(dbapi_connection)
        )
        relay = outbox.Relay(engine, _noop, batch_size=batch_size, relay_id=BENCH_RELAY_ID)
        try:
            start = time.perf_counter()
            published = relay.drain().published
            return published, time.perf_counter() - start
        finally:
            relay.close()
            engine.dispose()

    return drain


def _profiles(ctx: Context, batch_size: int) -> dict[str, list[dict[str, Any]]]:
    runs = 1 if ctx.quick else PROFILED_DRAINS
    ours = _profiled_relay(ctx, batch_size)
    profiles: dict[str, list[dict[str, Any]]] = {"ours": [], "hand-written loop": []}
    for _ in range(runs):
        profiles["ours"].append(_profile(ctx, ours))
        profiles["hand-written loop"].append(
            _profile(ctx, lambda clock: _drain_hand_written(ctx, batch_size, clock=clock))
        )
    return profiles


def _share_row(
    name: str, kinds: tuple[str, ...], profiles: dict[str, list[dict[str, Any]]]
) -> Result:
    """An informative row: the median share (%) of ours' drain time spent in ``kinds``."""
    shares = [sum(p["share_per_mille"].get(k, 0.0) for k in kinds) / 10 for p in profiles["ours"]]
    return Result(name=name, unit="%", ours=statistics.median(shares), samples={"ours": shares})


def _split(profiles: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per side, the median over the profiled drains of each kind's ms per pass."""
    split: dict[str, dict[str, float]] = {}
    for side, runs in profiles.items():
        kinds = {kind for run in runs for kind in run["ms_per_pass"]}
        split[side] = {
            kind: round(statistics.median(run["ms_per_pass"].get(kind, 0.0) for run in runs), 3)
            for kind in sorted(kinds)
        }
    return split


def run_drain(ctx: Context) -> list[Result]:
    """Drain rows/s at batch 100 and 1000: ours, the hand-written loop, the loop decoding."""
    _prepare(ctx)
    results: list[Result] = []
    for batch_size in BATCH_SIZES:
        ctx.log(f"drain b={batch_size}: ours / hand-written loop / decoded loop, interleaved")
        drainers: dict[str, Drainer] = {
            "ours": _drain_relay,
            "hand-written loop": _drain_hand_written,
            "hand-written, decoded": lambda ctx, b: _drain_hand_written(ctx, b, decode=True),
        }
        samples, counts = interleave_drains(ctx, drainers, batch_size)
        ctx.log(f"drain b={batch_size}: profiling round trips (untimed for the table)")
        profiles = _profiles(ctx, batch_size)
        split = _split(profiles)
        ctx.log(f"drain b={batch_size}: ms per pass {json.dumps(split)}")
        results += [
            compare(
                f"drain b={batch_size}: Relay.drain() vs hand-written loop",
                "rows/s",
                samples,
                "ours",
                "hand-written loop",
                rows=ctx.scale.drain_rows,
                published_per_round=counts,
                ms_per_pass=split,
                profiles=profiles,
            ),
            compare(
                f"drain b={batch_size}: Relay.drain() vs hand-written loop decoding as ours",
                "rows/s",
                samples,
                "ours",
                "hand-written, decoded",
            ),
            _share_row(
                f"drain b={batch_size}: ordering guard (plan_stmt), % of ours' time",
                ("ordering guard",),
                profiles,
            ),
            _share_row(
                f"drain b={batch_size}: isolation SET/reset + pool ROLLBACK, % of ours' time",
                ("isolation level", "rollback"),
                profiles,
            ),
        ]
    return results
