"""Workloads 3 and 4: how fast relays empty a backlog, against the database's own limit.

Before every timed drain the outbox is restored to the same snapshot of ``drain_rows`` rows
(committed through ``outbox.enqueue``, ten per transaction), then ``VACUUM ANALYZE`` and
``CHECKPOINT``, untimed (:func:`~benchmarks.harness.restore_outbox`). The publisher does nothing,
so what is measured is the outbox machinery alone.

Workload 3, per batch size, three arms:

* **ours**: ``Relay(engine, lambda m: None, batch_size=b, relay_id="ours").drain()`` (a relay
  id as short as the baseline's token prefix: :data:`BENCH_RELAY_ID`): one statement per pass,
  each pass's mark riding on the next claim (:func:`sqla_outbox.queries.fast_claim_stmt`).
* **raw SQL** (the baseline): a psycopg 3 loop in autocommit, on the same table, doing the
  minimal equivalent of a relay pass: a one-statement claim (``UPDATE ... WHERE id =
  ANY(ARRAY(SELECT ... ORDER BY staged_at, id LIMIT b FOR UPDATE SKIP LOCKED)) RETURNING`` the
  same columns, stamped with a per-pass token; :data:`RAW_CLAIM` says why not ``IN``) and one
  fenced mark (``UPDATE ... SET published_at = now() WHERE id = ANY(claimed ids) AND claimed_by
  = token AND published_at IS NULL``; :data:`RAW_MARK` says why the ids). Same round trips per
  pass as the relay, same rows fetched and decoded by the same driver (JSONB, UUIDs,
  timestamps): the database's own limit for an at-least-once relay. It lacks the library's
  per-transaction ordering guard across concurrent relays, which is part of what is priced.
* **library SQL, no Python** (informative): the same psycopg loop sending the relay's exact
  statements (compiled from :mod:`sqla_outbox.queries` as the relay compiles them: a claim,
  then each pass's mark inside the next claim, as ``Relay.drain()`` does), with the relay's
  parameters and, like the relay's connection, ``SET jit = off``, read through the relay's
  cursor (its ``jsonb`` decoding). It splits the gap between the other two: ``raw SQL ->
  library SQL`` is what the library's claim costs in the database, less what that decoding
  saves per row, ``library SQL -> ours`` is SQLAlchemy and Python per row and per pass.
* **ordered raw SQL** (informative): the raw loop with the cheapest claim that keeps each
  transaction's order (:data:`RAW_ORDERED_CLAIM`: a bounded look at what lies before the
  candidates, rows handed back in claim order). ``raw SQL -> ordered raw SQL`` is what keeping
  order costs any relay; ``ours`` against it is what the library adds on top.
* **ours, order='strict'** (informative, smallest batch size only): the same relay keeping the
  total order (:data:`STRICT`). Its claim also looks for the first failed row of the whole
  backlog; the row says what that costs when nothing has failed, which stays small only while
  that search can use ``ix_outbox_failing`` on a generic plan.
* **ours, planned claim only** (informative, smallest and largest batch sizes): the same relay
  with PostgreSQL's one-statement claim turned off (:class:`benchmarks.variants.PlannedOnly`),
  every claim the protocol every store runs: what the one-statement claim buys.
* **ours, with rows held behind dead letters** (smallest batch size only, target ratio >= 0.9
  against ``ours``): the same relay with 10,000 parked rows and their 100 dead letters ahead of
  the backlog (:data:`HELD`). Dead letters wait for an operator, perhaps for days; meanwhile
  every other message must flow as fast as without them.

Workload 4: two ``Relay`` instances running their own background loops (``start()``, the loop a
deployed relay runs, LISTEN included; ``stop()`` once all rows are out) over the same rows,
against one relay doing the same: aggregate rows/s from ``start()`` until the last message
arrives, and duplicates (publishes minus distinct ids) summed over all rounds, which must be 0.
Both arms pay the same per-relay costs; the comparison prices what a second relay adds (SKIP
LOCKED contention, the per-transaction ordering guard) against what it brings (a second
connection working while the first waits).
"""

from __future__ import annotations

import datetime as dt
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import sqla_outbox as outbox
from benchmarks.harness import (
    Context,
    Result,
    Target,
    compare,
    fill_backlog,
    fresh_pool,
    interleave,
    restore_outbox,
    snapshot_outbox,
)
from benchmarks.held_rows import DEAD_LETTERS, HELD_ROWS, INSERT_HELD, PARK_HELD
from benchmarks.variants import PlannedOnly
from sqla_outbox import plan, queries
from sqla_outbox.stores import psycopg_sql

__all__ = [
    "BATCH_SIZES",
    "BENCH_RELAY_ID",
    "RAW_CLAIM",
    "RAW_MARK",
    "interleave_drains",
    "run_drain",
    "run_two_relays",
]

BATCH_SIZES = (100, 500, 1000)
TWO_RELAYS_BATCH = 100  # the library's default batch size
RELAYS_TIMEOUT = 120.0  # seconds; a round that times out reports the rows it did publish
ABSOLUTE_TARGET = 25_000.0  # rows/s at batch 1000

_COLUMNS = ", ".join(queries.MESSAGE_FIELDS)
RAW_CLAIM = (
    "UPDATE outbox SET claimed_by = %s, claimed_at = now() WHERE id = ANY(ARRAY("
    "SELECT id FROM outbox WHERE published_at IS NULL AND run_at <= now() "
    "AND (claimed_at IS NULL OR claimed_at < now() - interval '30 seconds') "
    "ORDER BY staged_at, id LIMIT %s FOR UPDATE SKIP LOCKED)) "
    f"RETURNING {_COLUMNS}"
)
"""The baseline claim: the minimal correct one-statement lease, as a DBA would write it.

``id = ANY(ARRAY(SELECT ... FOR UPDATE SKIP LOCKED))`` rather than ``id IN (SELECT ...)``: the
same rows, locks and stamps, but the ``IN`` form lets the planner turn the outer UPDATE into a
hash semi-join over a sequential scan of the whole table once the batch is large.
``ANY(ARRAY(...))`` always probes the primary key, so the baseline is the database's best.
"""
RAW_MARK = (
    "UPDATE outbox SET published_at = now() "
    "WHERE id = ANY(%s) AND claimed_by = %s AND published_at IS NULL"
)
"""The baseline mark: one fenced statement per pass, finding the claimed rows by primary key.

Fenced on ``claimed_by`` like the library's. Without ``id = ANY(ids)``, ``WHERE claimed_by = %s
AND published_at IS NULL`` has no index to use (nothing indexes ``claimed_by``) and scans every
unpublished row on each pass, a cost that grows with the backlog and that the library's mark
does not pay. A competent hand-written relay passes the ids it claimed.
"""

RAW_ORDERED_CLAIM = (
    "WITH candidates AS (SELECT id, staged_at FROM outbox WHERE published_at IS NULL "
    "AND run_at <= now() AND (claimed_at IS NULL OR claimed_at < now() - interval '30 seconds') "
    "ORDER BY staged_at, id LIMIT %(batch)s FOR UPDATE SKIP LOCKED), "
    "gate AS (SELECT (SELECT count(*) FROM (SELECT 1 FROM outbox a WHERE a.published_at IS NULL "
    "AND a.run_at <= now() AND (a.staged_at, a.id) <= (SELECT staged_at, id FROM candidates "
    "ORDER BY staged_at DESC, id DESC LIMIT 1) ORDER BY a.staged_at, a.id "
    "LIMIT %(batch)s + 1) ahead) > (SELECT count(*) FROM candidates) AS crowded), "
    "claimed AS (UPDATE outbox SET claimed_by = %(token)s, claimed_at = now() "
    "WHERE id = ANY(ARRAY(SELECT id FROM candidates)) AND NOT (SELECT crowded FROM gate) "
    f"RETURNING {_COLUMNS}) "
    "SELECT * FROM claimed ORDER BY staged_at, id"
)
"""The cheapest claim a hand-written relay can make that keeps every transaction's order.

:data:`RAW_CLAIM` takes whatever it can lock: with two relays, a transaction's later rows can
be published while its first is still in the other relay's claim. A claim that keeps order
must look at what lies before its candidates; the least it can do is one bounded range scan of
the unpublished rows up to its last candidate (take the candidates only if they are all there
is), and hand its rows back in claim order. This is that claim, nothing more: no ordering keys,
retries, dead letters or parking, and when anything is ahead it takes nothing (it has no way
to find the rows it could still take). Informative: the price of order, measured in the run.
"""


BENCH_RELAY_ID = "ours"
"""The relay id of workload 3's relay: its tokens (``ours:<16 hex>``) are as long as the raw
loop's (``raw:<16 hex>``). The default ``relay-<uuid4>`` makes every token 40 characters longer,
and each claim writes its token into every row it takes, so a longer token costs server time on
every claimed row. That is the price of a readable claimant, not of the library's machinery, so
both sides pay the same. Workload 4's relays keep the default ids."""


STRICT = "ours, order='strict'"
"""Workload 3's arm at the smallest batch size: the same relay keeping the total order."""


PLANNED = "ours, planned claim only"
"""The relay with PostgreSQL's one-statement claim turned off (:mod:`benchmarks.variants`)."""
HELD = f"ours, {HELD_ROWS:,} rows held behind dead letters"
"""Workload 3's arm at the smallest batch size: the same relay with
:data:`~benchmarks.held_rows.HELD_ROWS` rows ahead of the backlog that no claim may take
(:mod:`benchmarks.held_rows`), already parked, as a relay that has met them leaves them. The
drain publishes the same rows; what the held rows cost is each mark's search for rows to unpark
and each claim's step past them. The mark must find only the rows parked behind what it marks
(through ``ix_outbox_parked_behind``), never read every parked row, or the held rows would cost
every pass in proportion to their number."""


def _drain_relay_held(ctx: Context, batch_size: int) -> tuple[int, float]:
    """:func:`_drain_relay` with the held rows added (untimed) to the restored snapshot."""
    ctx.sql(INSERT_HELD, "ANALYZE outbox", *PARK_HELD, "VACUUM ANALYZE outbox", "CHECKPOINT")
    return _drain_relay(ctx, batch_size)


def _noop(_message: object) -> None:
    return None


def _prepare(ctx: Context) -> None:
    """Fill the outbox once through the library and snapshot it for every drain to restore.

    Workloads 3 and 4 share the snapshot: the second one to run finds it and keeps it.
    """
    with ctx.engine.connect() as conn:  # through SQLAlchemy: the MySQL suite shares this
        if sa.inspect(conn).has_table("outbox_template"):
            count = conn.scalar(sa.text("SELECT count(*) FROM outbox_template"))
            if count == ctx.scale.drain_rows:
                return
    ctx.clear_tables()
    ctx.log(f"filling {ctx.scale.drain_rows:,} rows through outbox.enqueue, 10 per transaction")
    fill_backlog(ctx, ctx.scale.drain_rows)
    snapshot_outbox(ctx)


def _drain_relay(
    ctx: Context,
    batch_size: int,
    *,
    publish: Callable[[outbox.OutboxMessage], None] = _noop,
    relay_type: type[outbox.Relay] = outbox.Relay,
    **options: Any,
) -> tuple[int, float]:
    """Ours: ``Relay.drain()`` (with the no-op publisher unless ``publish``, ``options`` passed
    to the relay), on a freshly opened pool connection; rows published and seconds."""
    fresh_pool(ctx.engine)
    # A relay id as short as the baseline's "raw" prefix, so both sides stamp fence tokens of
    # the same length on every claimed row; see BENCH_RELAY_ID.
    relay = relay_type(
        ctx.engine, publish, batch_size=batch_size, relay_id=BENCH_RELAY_ID, **options
    )
    start = time.perf_counter()
    published = relay.drain().published
    elapsed = time.perf_counter() - start
    relay.close()
    return published, elapsed


def _drain_raw(ctx: Context, batch_size: int, *, ordered: bool = False) -> tuple[int, float]:
    """The baseline loop: claim b (:data:`RAW_CLAIM`, or :data:`RAW_ORDERED_CLAIM` when
    ``ordered``), hand each row to the no-op publisher, one fenced mark."""
    with ctx.raw() as conn:
        published = 0
        start = time.perf_counter()
        while True:
            token = f"raw:{secrets.token_hex(8)}"
            if ordered:
                rows = conn.execute(RAW_ORDERED_CLAIM, {"token": token, "batch": batch_size})
            else:
                rows = conn.execute(RAW_CLAIM, (token, batch_size))
            claimed = rows.fetchall()
            for row in claimed:
                _noop(row)
            if claimed:
                conn.execute(RAW_MARK, ([row[0] for row in claimed], token))
            published += len(claimed)
            if len(claimed) < batch_size:
                break
        return published, time.perf_counter() - start


def _library_sql(ctx: Context) -> tuple[psycopg_sql.Precompiled, psycopg_sql.Precompiled]:
    """The relay's one-statement claim, without and with a mark riding on it (what a relay
    alone on this backlog sends), compiled as the relay compiles them for psycopg.

    Each keeps its own literal parameters: both statements have a ``param_1``, and it is not
    the same value.
    """
    dialect = ctx.engine.dialect
    claim = psycopg_sql.precompile(queries.fast_claim_stmt(), dialect)
    merged = psycopg_sql.precompile(queries.fast_claim_stmt(mark=True), dialect)
    return claim, merged


def _drain_library_sql(ctx: Context, batch_size: int) -> tuple[int, float]:
    """The relay's exact statements from a bare psycopg loop: the library's SQL, minus Python.

    As ``Relay.drain()`` sends them: a claim, then each pass's mark inside the next claim (the
    ``marked`` and ``unparked`` counts first, then ``crowded`` and ``skip_to``, then the message
    columns), from the front, until a claim comes back empty. Nothing is held back here, so
    the relay sends only its one-statement claims; a claim that found the outbox crowded would
    make this arm measure something else, and stops it.
    The connection runs ``SET jit = off`` first (untimed), as the relay's held connection does,
    and sends the numbered SQL through the relay's own ``RawCursor``, which also reads ``jsonb``
    as the relay does (``psycopg_sql.relay_cursor``).
    """
    claim, merged = _library_sql(ctx)
    lease = dt.timedelta(seconds=30)
    with ctx.raw() as conn:
        conn.execute(b"SET jit = off")
        psycopg_sql.send_arrays_binary(conn)
        cursor = psycopg_sql.relay_cursor()(conn)
        published = 0
        previous: dict[str, Any] = {}
        start = time.perf_counter()
        while True:
            token = f"lib:{secrets.token_hex(8)}"
            statement = merged if previous else claim
            params = statement.params(
                {
                    "done": token,
                    **previous,
                    "limit": batch_size,
                    "lease": lease,
                    "token": token,
                    "after_staged_at": plan.FRONT[0],
                    "after_id": plan.FRONT[1],
                }
            )
            header = 4 if previous else 2
            sql = statement.text(params, numbered=True)  # as the relay sends it
            rows = cursor.execute(sql.encode(), statement.values(params)).fetchall()
            if rows[0][header - 2]:
                raise RuntimeError("the library-SQL arm found the outbox crowded")
            rows = [row[header:] for row in rows] if rows[0][header] is not None else []
            for row in rows:
                _noop(row)
            if not rows:
                break
            published += len(rows)
            previous = {"done": token, "previous_ids": [row[0] for row in rows]}
        return published, time.perf_counter() - start


Drainer = Callable[[Context, int], tuple[int, float]]


def _rate_arm(
    ctx: Context, drainer: Drainer, batch_size: int, counts: list[int]
) -> Callable[[], float]:
    def arm() -> float:
        restore_outbox(ctx)
        published, elapsed = drainer(ctx, batch_size)
        counts.append(published)
        return published / elapsed

    return arm


def interleave_drains(
    ctx: Context, drainers: dict[str, Drainer], batch_size: int
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Rows/s of every drainer per round (each after a restore), interleaved; and how many
    rows each drain published."""
    counts: dict[str, list[int]] = {name: [] for name in drainers}
    arms = {
        name: _rate_arm(ctx, drainer, batch_size, counts[name])
        for name, drainer in drainers.items()
    }
    return interleave(arms, ctx.scale.drain_rounds), counts


def run_drain(ctx: Context) -> list[Result]:
    """Workload 3: drain rows/s at batch 100, 500 and 1000, interleaved per batch size."""
    _prepare(ctx)
    results: list[Result] = []
    for batch_size in BATCH_SIZES:
        ctx.log(f"drain b={batch_size}: ours / raw SQL / library SQL / ordered raw, interleaved")
        drainers: dict[str, Drainer] = {
            "ours": _drain_relay,
            "raw SQL": _drain_raw,
            "library SQL": _drain_library_sql,
            "ordered raw SQL": lambda ctx, b: _drain_raw(ctx, b, ordered=True),
        }
        if batch_size in (min(BATCH_SIZES), max(BATCH_SIZES)):
            drainers[PLANNED] = lambda ctx, b: _drain_relay(ctx, b, relay_type=PlannedOnly)
        if batch_size == min(BATCH_SIZES):
            drainers[STRICT] = lambda ctx, b: _drain_relay(ctx, b, order="strict")
            drainers[HELD] = _drain_relay_held
        samples, counts = interleave_drains(ctx, drainers, batch_size)
        targets = [Target("ratio", ">=", 0.9)]
        if batch_size == max(BATCH_SIZES):
            targets.append(Target("ours", ">=", ABSOLUTE_TARGET, "rows/s"))
        results.append(
            compare(
                f"drain b={batch_size} vs raw SQL",
                "rows/s",
                samples,
                "ours",
                "raw SQL",
                *targets,
                published_per_round=counts,
            )
        )
        results.append(
            compare(
                f"drain b={batch_size}: library SQL, no Python",
                "rows/s",
                samples,
                "library SQL",
                "raw SQL",
            )
        )
        results.append(
            compare(
                f"drain b={batch_size}: ordered raw SQL (the price of order)",
                "rows/s",
                samples,
                "ordered raw SQL",
                "raw SQL",
            )
        )
        results.append(
            compare(
                f"drain b={batch_size} vs ordered raw SQL",
                "rows/s",
                samples,
                "ours",
                "ordered raw SQL",
            )
        )
        if STRICT in samples:
            results.append(
                compare(
                    f"drain b={batch_size}: order='strict' vs order='key'",
                    "rows/s",
                    samples,
                    STRICT,
                    "ours",
                )
            )
        if PLANNED in samples:
            results.append(
                compare(
                    f"drain b={batch_size}: planned claim only vs ours (what the one-statement "
                    "claim buys)",
                    "rows/s",
                    samples,
                    PLANNED,
                    "ours",
                )
            )
        if HELD in samples:
            results.append(
                compare(
                    f"drain b={batch_size}, {HELD_ROWS:,} rows held behind {DEAD_LETTERS} dead "
                    "letters vs none",
                    "rows/s",
                    samples,
                    HELD,
                    "ours",
                    Target("ratio", ">=", 0.9),
                    published_per_round={HELD: counts[HELD]},
                )
            )
    return results


def _run_relays(ctx: Context, relays: int, seen: list[int]) -> float:
    """``relays`` relays running their background loops (``start()``) until every row is out.

    Rows/s from the first ``start()`` until the publisher has seen ``drain_rows`` messages; the
    ``stop()`` calls are untimed. Every publish appends its message id to ``seen`` (empty on
    entry), duplicates included, so the caller can count them: as an integer, which Python's
    garbage collector does not track (kept ``UUID`` objects would make its full collections in
    the relays' process slower round after round).
    """
    restore_outbox(ctx)
    total = ctx.scale.drain_rows
    everything = threading.Event()
    lock = threading.Lock()

    def publish(message: outbox.OutboxMessage) -> None:
        with lock:
            seen.append(message.id.int)
            if len(seen) >= total:
                everything.set()

    fresh_pool(ctx.engine, connections=relays)
    workers = [
        outbox.Relay(ctx.engine, publish, batch_size=TWO_RELAYS_BATCH) for _ in range(relays)
    ]
    start = time.perf_counter()
    for relay in workers:
        relay.start()
    everything.wait(RELAYS_TIMEOUT)
    elapsed = time.perf_counter() - start
    published = min(len(seen), total)
    for relay in workers:
        relay.stop()
    return published / elapsed


def run_two_relays(ctx: Context) -> list[Result]:
    """Workload 4: two relays in threads against one, on the same rows; and no duplicates."""
    _prepare(ctx)
    ctx.log(f"two relays vs one (b={TWO_RELAYS_BATCH}, start()/stop()), interleaved")
    # Per round of two relays: (publishes, distinct ids); the ids themselves are dropped.
    counted: list[tuple[int, int]] = []
    published_rows: dict[str, list[int]] = {"two relays": [], "one relay": []}

    def arm(name: str, relays: int) -> Callable[[], float]:
        def run() -> float:
            ids: list[int] = []
            rate = _run_relays(ctx, relays, ids)
            if relays == 2:
                counted.append((len(ids), len(set(ids))))
            published_rows[name].append(len(ids))
            return rate

        return run

    samples = interleave(
        {"two relays": arm("two relays", 2), "one relay": arm("one relay", 1)},
        ctx.scale.drain_rounds,
    )
    duplicates = sum(published - distinct for published, distinct in counted)
    missing = sum(ctx.scale.drain_rows - distinct for _, distinct in counted)
    return [
        compare(
            f"two relays vs one (b={TWO_RELAYS_BATCH}, start/stop)",
            "rows/s",
            samples,
            "two relays",
            "one relay",
            Target("ratio", ">=", 1.0),
            published_per_round=published_rows,
        ),
        _duplicates_row(duplicates, missing, len(counted)),
    ]


def _duplicates_row(duplicates: int, missing: int, rounds: int) -> Result:
    return Result(
        name=f"two relays: duplicates over {rounds} drains",
        unit="",
        ours=float(duplicates),
        targets=(Target("ours", "==", 0),),
        extra={"duplicates": duplicates, "missing": missing},
    )
