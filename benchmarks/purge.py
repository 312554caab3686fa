"""Workload ``purge``: how fast ``outbox.purge`` deletes published rows, and what it costs a relay.

It runs on a database of its own, ``<db>_purge`` next to the suite's (created at the start of
the workload and dropped at its end, ``--keep`` or not), whose outbox is a version-3 table: the
one with ``ix_outbox_published``, which a purge reads and every relay mark writes. The rows are
inserted with ``INSERT ... SELECT generate_series`` as enqueue writes them (ten per transaction,
one ``staged_at``, a small JSON input) and kept in ``purge_template``; before every timed arm the
outbox is restored from it, vacuumed, analysed and checkpointed, untimed. Publishers do nothing,
so what is measured is the outbox machinery alone. Three comparisons, each interleaved:

1. **Purge rate** (rows/s, batch 10,000, the default, and 1,000, a relay's background round):
   ``history`` rows published ten days ago plus 10,000 unpublished ones the purge must leave.
   *Ours* is :func:`sqla_outbox.purge`'s loop (:func:`~sqla_outbox.retention.purge_cutoff`,
   then :func:`~sqla_outbox.retention.purge_batches`: each batch its own transaction, ``DELETE
   ... WHERE id = ANY(ARRAY(SELECT ... ORDER BY published_at LIMIT b FOR UPDATE SKIP LOCKED))``),
   timed batch by batch for the longest one; ``purge()`` adds only its one-off table check.
   The *baseline* is the hand-written batched delete a DBA would run from psql: the cutoff read
   once, then :data:`RAW_PURGE` in autocommit until a batch comes back short. It takes no row
   locks: the library's ``FOR UPDATE SKIP LOCKED`` (so that two purges take different rows) is
   part of what the ratio prices.
2. **A drain beside a purge**: ``Relay(batch_size=100).drain()`` of ``backlog`` unpublished rows
   over the ``history``; once :data:`WARM_UP` messages are out, ``outbox.purge(batch_size=10,000)``
   deletes the history in another thread. The drain's rate inside the purge's window, against
   the same drain with no purge over a window of the same length (the previous purge's), and
   the whole drain against the whole drain. The purge's own rate beside the drain is reported
   against its rate alone from (1) (other rounds, so that ratio is not paired).
3. **The index's cost to a drain**: the drain alone of (2) against the same drain on the same
   rows with ``ix_outbox_published`` dropped (untimed, after the restore): version 2's layout,
   whose marks write one index fewer. Arm of the same rounds as (2).

And, informative, the purge rate of (1) at batch 10,000 on an SQLite file (restored by copying a
seeded file), with no baseline.

No target: these rows are informative; nothing the library promises bounds them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.engine import URL

import sqla_outbox as outbox
from benchmarks.harness import (
    OUTBOX_TABLE,
    Context,
    Result,
    compare,
    drop_database,
    interleave,
    make_engine,
    recreate_database,
)
from sqla_outbox import retention

__all__ = ["RAW_PURGE", "WARM_UP", "purge_url", "run"]

WEEK = dt.timedelta(days=7)
UNPUBLISHED_BESIDE_HISTORY = 10_000
"""Unpublished rows present while the purge rate is timed: a purge must step over them."""
WARM_UP = 5_000
"""Messages a drain publishes before the purge beside it starts (full run)."""

_SEED = sa.text(
    """
INSERT INTO outbox (id, job, queue, input, idempotency_key, max_attempts, run_at, staged_at,
                    published_at)
SELECT gen_random_uuid(), 'send_receipt', 'default', jsonb_build_object('order_id', i),
       md5(i::text), 3, ts, ts, CASE WHEN :published THEN ts END
FROM (SELECT i, now() - :age + ((i - :first) / 10) * interval '1 millisecond' AS ts
      FROM generate_series(:first, :first + :count - 1) AS i) AS rows
"""
).bindparams(
    sa.bindparam("published", type_=sa.Boolean()), sa.bindparam("age", type_=sa.Interval())
)
"""Rows as enqueue writes them: ten per transaction (one ``staged_at``), a small JSON input."""

RAW_PURGE = (
    "DELETE FROM outbox WHERE id = ANY(ARRAY(SELECT id FROM outbox WHERE published_at < %s "
    "ORDER BY published_at LIMIT %s))"
)
"""The baseline's batch: the oldest published rows by ``ix_outbox_published``, deleted through
the primary key (``= ANY(ARRAY(...))``, as the library's and workload 3's baseline do), no lock."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Sizes:
    history: int
    """Published rows, ten days old, that each purge deletes."""
    backlog: int
    """Unpublished rows each drain of comparisons 2 and 3 publishes."""
    warm_up: int
    rounds: int
    """Rounds of each comparison: 5 in a full run keeps the workload near a minute and a half
    (a round of comparison 2 and 3 restores and drains three times)."""


def _sizes(ctx: Context) -> _Sizes:
    if ctx.quick:
        return _Sizes(history=20_000, backlog=10_000, warm_up=1_000, rounds=2)
    return _Sizes(history=200_000, backlog=50_000, warm_up=WARM_UP, rounds=5)


def purge_url(url: URL) -> URL:
    """The workload's own database, next to the suite's."""
    return url.set(database=f"{url.database}_purge")


# --- the rows ------------------------------------------------------------------------------------


class _Outbox:
    """The purge database's outbox: seeding, the snapshot, and restoring it with or without
    ``ix_outbox_published``."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        with ctx.raw() as conn:
            found = conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_outbox_published'"
            ).fetchone()
        if found is None:
            raise RuntimeError(
                "the purge database's outbox has no ix_outbox_published: it must be a version-3 "
                "table (sqla_outbox.metadata.create_all builds one)"
            )
        self.create_index = str(found[0]).replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1)

    def seed(self, *, history: int, backlog: int) -> None:
        """``history`` rows published ten days ago, then ``backlog`` unpublished rows staged an
        hour ago (all due), kept in ``purge_template``."""
        self.ctx.sql("TRUNCATE outbox")
        with self.ctx.engine.begin() as conn:
            conn.execute(
                _SEED,
                {"published": True, "age": dt.timedelta(days=10), "first": 0, "count": history},
            )
            conn.execute(
                _SEED,
                {
                    "published": False,
                    "age": dt.timedelta(hours=1),
                    "first": history,
                    "count": backlog,
                },
            )
        self.ctx.sql(
            "DROP TABLE IF EXISTS purge_template",
            "CREATE TABLE purge_template AS SELECT * FROM outbox",
        )

    def restore(self, *, index: bool = True) -> None:
        """The snapshot back, with ``ix_outbox_published`` or without, vacuumed, analysed and
        checkpointed."""
        self.ctx.sql(
            "TRUNCATE outbox",
            self.create_index if index else "DROP INDEX IF EXISTS ix_outbox_published",
            "INSERT INTO outbox SELECT * FROM purge_template",
            "VACUUM ANALYZE outbox",
            "CHECKPOINT",
        )


# --- 1. the purge rate ---------------------------------------------------------------------------


def _purge_ours(engine: Engine, batch_size: int) -> tuple[int, float, float]:
    """``outbox.purge``'s loop, each batch timed: rows, seconds, the longest batch's seconds."""
    started = time.perf_counter()
    with engine.begin() as conn:
        cutoff = retention.purge_cutoff(conn, WEEK)
    rows, longest = 0, 0.0
    batches = retention.purge_batches(engine, cutoff, batch_size)
    while True:
        batch_started = time.perf_counter()
        deleted = next(batches, None)
        if deleted is None:
            break
        longest = max(longest, time.perf_counter() - batch_started)
        rows += deleted
    return rows, time.perf_counter() - started, longest


def _purge_raw(ctx: Context, batch_size: int) -> tuple[int, float]:
    """The baseline: the cutoff once, then :data:`RAW_PURGE` in autocommit until a short batch."""
    with ctx.raw() as conn:
        rows = 0
        started = time.perf_counter()
        found = conn.execute("SELECT now() - interval '7 days'").fetchone()
        assert found is not None
        while True:
            deleted = conn.execute(RAW_PURGE, (found[0], batch_size)).rowcount
            rows += deleted
            if deleted < batch_size:
                break
        return rows, time.perf_counter() - started


def _purge_rates(ctx: Context, table: _Outbox, sizes: _Sizes) -> list[Result]:
    ctx.log(f"seeding {sizes.history:,} published + {UNPUBLISHED_BESIDE_HISTORY:,} pending rows")
    table.seed(history=sizes.history, backlog=UNPUBLISHED_BESIDE_HISTORY)
    longest: dict[int, list[float]] = {10_000: [], 1_000: []}

    def ours(batch_size: int) -> Callable[[], float]:
        def arm() -> float:
            table.restore()
            rows, seconds, slowest = _purge_ours(ctx.engine, batch_size)
            _expect(rows, sizes.history, f"purge b={batch_size}")
            longest[batch_size].append(slowest * 1000)
            return rows / seconds

        return arm

    def raw(batch_size: int) -> Callable[[], float]:
        def arm() -> float:
            table.restore()
            rows, seconds = _purge_raw(ctx, batch_size)
            _expect(rows, sizes.history, f"raw DELETE b={batch_size}")
            return rows / seconds

        return arm

    ctx.log("purge b=10,000 / raw DELETE b=10,000 / purge b=1,000 / raw DELETE b=1,000")
    samples = interleave(
        {
            "purge b=10,000": ours(10_000),
            "raw DELETE b=10,000": raw(10_000),
            "purge b=1,000": ours(1_000),
            "raw DELETE b=1,000": raw(1_000),
        },
        sizes.rounds,
    )
    return [
        compare(
            f"purge {sizes.history:,} rows b={size:,} vs hand-written batched DELETE",
            "rows/s",
            samples,
            f"purge b={size:,}",
            f"raw DELETE b={size:,}",
            longest_batch_ms=longest[size],
            longest_batch_ms_median=statistics.median(longest[size]),
        )
        for size in (10_000, 1_000)
    ]


def _expect(rows: int, expected: int, what: str) -> None:
    if rows != expected:
        raise RuntimeError(f"{what} deleted {rows:,} rows, expected {expected:,}")


# --- 2 and 3. a drain beside a purge, and the index's cost ---------------------------------------


class _Clocked:
    """A publisher that records when each message went out."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, _message: object) -> None:
        self.times.append(time.perf_counter())

    def rate(self, start: float, end: float) -> float:
        return sum(start <= t <= end for t in self.times) / (end - start)


@dataclasses.dataclass
class _Beside:
    """The drains of comparisons 2 and 3 and what they measured, round by round."""

    ctx: Context
    table: _Outbox
    sizes: _Sizes
    window: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    """Rows/s of the drain inside the purge's window (or as long a window without one)."""
    purge_rates: list[float] = dataclasses.field(default_factory=list)
    last_purge: float = 0.0
    """Seconds the last purge beside a drain took: the window of the next drain without one."""

    def drain(self, *, purge: bool, index: bool = True) -> float:
        """Restore, drain the backlog, and once ``warm_up`` messages are out run a purge in
        another thread (or, without ``purge``, wait as long as the last one took). Returns the
        whole drain's rows/s; the window's rate goes to :attr:`window`."""
        self.table.restore(index=index)
        publisher = _Clocked()
        relay = outbox.Relay(self.ctx.engine, publisher, batch_size=100, poll_only=True)
        bounds: list[float] = []
        purged: list[int] = []
        errors: list[BaseException] = []

        def side() -> None:
            try:
                while len(publisher.times) < self.sizes.warm_up:
                    time.sleep(0.001)  # a benchmark's poll, not a test's synchronisation
                bounds.append(time.perf_counter())
                if purge:
                    purged.append(outbox.purge(self.ctx.engine, older_than=WEEK))
                else:
                    time.sleep(self.last_purge)
                bounds.append(time.perf_counter())
            except BaseException as error:  # re-raised on the drain's thread below
                errors.append(error)

        thread = threading.Thread(target=side, daemon=True)
        thread.start()
        started = time.perf_counter()
        published = relay.drain().published
        ended = time.perf_counter()
        thread.join(60)
        relay.close()
        if errors:
            raise errors[0]
        _expect(published, self.sizes.backlog, "the drain")
        if len(bounds) != 2 or bounds[1] >= publisher.times[-1]:
            raise RuntimeError(
                "the drain ended before the purge beside it did, so its rate in the purge's "
                "window is not measured; make the backlog larger than the history's purge takes"
            )
        seconds = bounds[1] - bounds[0]
        name = ("beside a purge" if purge else "alone") + ("" if index else ", no index")
        self.window.setdefault(name, []).append(publisher.rate(bounds[0], bounds[1]))
        if purge:
            self.last_purge = seconds
            _expect(purged[0], self.sizes.history, "the purge beside the drain")
            self.purge_rates.append(purged[0] / seconds)
        return published / (ended - started)


def _drains(ctx: Context, table: _Outbox, sizes: _Sizes, purge_alone: float) -> list[Result]:
    ctx.log(f"seeding {sizes.history:,} published + {sizes.backlog:,} pending rows")
    table.seed(history=sizes.history, backlog=sizes.backlog)
    beside = _Beside(ctx, table, sizes)
    ctx.log("drain b=100: beside a purge / alone / alone without ix_outbox_published")
    # "beside a purge" first: the first round's "alone" then waits as long as its purge took.
    samples = interleave(
        {
            "beside a purge": lambda: beside.drain(purge=True),
            "alone": lambda: beside.drain(purge=False),
            "alone, no index": lambda: beside.drain(purge=False, index=False),
        },
        sizes.rounds,
    )
    purge_beside = statistics.median(beside.purge_rates)
    return [
        compare(
            "drain b=100 while a purge runs vs alone (the purge's window)",
            "rows/s",
            beside.window,
            "beside a purge",
            "alone",
        ),
        compare(
            f"drain b=100 of {sizes.backlog:,} rows, a purge beside it vs alone (whole drain)",
            "rows/s",
            samples,
            "beside a purge",
            "alone",
        ),
        Result(
            name="purge b=10,000 beside a drain vs alone (not paired)",
            unit="rows/s",
            ours=purge_beside,
            baseline=purge_alone,
            baseline_name="purge alone",
            samples={"beside a drain": beside.purge_rates},
        ),
        compare(
            "drain b=100 with ix_outbox_published (v3) vs without (v2 layout)",
            "rows/s",
            samples,
            "alone",
            "alone, no index",
        ),
    ]


# --- SQLite --------------------------------------------------------------------------------------


def _sqlite_rate(ctx: Context, sizes: _Sizes) -> Result:
    """The purge rate of comparison 1 at batch 10,000 on an SQLite file, ours only."""
    ctx.log(f"SQLite: seeding {sizes.history:,} published rows")
    samples: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        seeded = Path(directory) / "seeded.sqlite3"
        working = Path(directory) / "outbox.sqlite3"
        engine = outbox.create_engine(f"sqlite:///{seeded}")
        outbox.metadata.create_all(engine)
        _seed_sqlite(engine, sizes.history)
        engine.dispose()
        for _ in range(sizes.rounds):
            shutil.copyfile(seeded, working)
            engine = outbox.create_engine(f"sqlite:///{working}")
            rows, seconds, _longest = _purge_ours(engine, 10_000)
            engine.dispose()
            _expect(rows, sizes.history, "the SQLite purge")
            samples.append(rows / seconds)
    return Result(
        name=f"SQLite: purge {sizes.history:,} rows b=10,000",
        unit="rows/s",
        ours=statistics.median(samples),
        samples={"purge b=10,000": samples},
    )


def _seed_sqlite(engine: Engine, history: int) -> None:
    published = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=10)
    rows = [
        {
            "id": uuid.uuid4(),
            "job": "send_receipt",
            "queue": "default",
            "input": {"order_id": i},
            "idempotency_key": str(i),
            "max_attempts": 3,
            "run_at": published,
            "staged_at": published + dt.timedelta(milliseconds=i // 10),
            "published_at": published + dt.timedelta(milliseconds=i // 10),
        }
        for i in range(history)
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(OUTBOX_TABLE), rows)


# --- the workload --------------------------------------------------------------------------------


def run(ctx: Context) -> list[Result]:
    """Purge rate against a hand-written batched DELETE; a drain beside a purge against alone;
    the drain with the purge's index against without; SQLite's purge rate."""
    sizes = _sizes(ctx)
    url = purge_url(ctx.url)
    recreate_database(url)
    engine = make_engine(url)
    side = Context(url=url, scale=ctx.scale, engine=engine, quick=ctx.quick, log=ctx.log)
    try:
        table = _Outbox(side)
        rates = _purge_rates(side, table, sizes)
        purge_alone = statistics.median(rates[0].samples["purge b=10,000"])
        results = rates + _drains(side, table, sizes, purge_alone)
    finally:
        engine.dispose()
        drop_database(url)
    results.append(_sqlite_rate(ctx, sizes))
    return results
