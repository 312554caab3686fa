"""Retention: how fast ``outbox.purge`` deletes published rows, and what it costs a relay.

Run on its own (it is not a workload of ``python -m benchmarks``)::

    python -m benchmarks.purge [--url postgresql+psycopg://postgres@127.0.0.1/postgres]

It creates (and drops) a scratch database next to ``--url``'s and prints four measurements, each
the median of ``--rounds`` rounds whose arms alternate (ABBA...), every round starting from the
same rows, vacuumed, analysed and checkpointed, untimed:

1. **purge rate**: ``outbox.purge(engine, older_than=7 days, batch_size=B)`` over 200,000 rows
   published ten days ago (plus a backlog of unpublished rows it must leave), rows/s, for B =
   10,000 (the default) and 1,000 (a relay's background round), with the longest batch.
2. **drain beside a purge**: a ``Relay(batch_size=100).drain()`` of 100,000 unpublished rows
   over those 200,000 published ones, rows/s while a purge (batch 10,000) deletes the history
   in another thread, against the same drain with no purge, over the same window of the drain.
3. **the index's cost to a drain**: the same drain (no history) on a version-2 table and on a
   version-3 one, whose marks also write ``ix_outbox_published``.
4. **SQLite**: the purge rate of (1) on an SQLite file.

The publisher does nothing, so what is measured is the outbox machinery alone.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine
from sqlalchemy.engine import URL

import alembic_ext  # noqa: F401 - registers op.create_outbox_table
import sqla_outbox as outbox
from sqla_outbox import retention
from sqla_outbox.engines import create_engine

HISTORY = 200_000
BACKLOG = 100_000
WEEK = dt.timedelta(days=7)

# Rows as enqueue writes them: ten per transaction (one staged_at), a small JSON input.
SEED = """
INSERT INTO outbox (id, job, queue, input, idempotency_key, max_attempts, run_at, staged_at,
                    published_at)
SELECT gen_random_uuid(), 'send_receipt', 'default', jsonb_build_object('order_id', i),
       md5(i::text), 3, ts, ts, CASE WHEN :published THEN ts END
FROM (SELECT i, now() - :age + ((i - :first) / 10) * interval '1 millisecond' AS ts
      FROM generate_series(:first, :first + :count - 1) AS i) AS rows
"""


_SEED = sa.text(SEED).bindparams(
    sa.bindparam("published", type_=sa.Boolean()), sa.bindparam("age", type_=sa.Interval())
)


def _noop(_message: object) -> None:
    pass


def _sql(engine: Engine, *statements: str) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)


def _create_table(engine: Engine, version: int) -> None:
    outbox.metadata.drop_all(engine)
    with engine.begin() as conn:
        op: Any = Operations(MigrationContext.configure(conn))
        op.create_outbox_table(version=version)


def _seed(engine: Engine, *, history: int, backlog: int) -> None:
    """``history`` rows published ten days ago, then ``backlog`` unpublished rows staged an hour
    ago (all due), kept in ``outbox_template`` for :func:`_restore`."""
    with engine.begin() as conn:
        if history:
            params = {"published": True, "age": 10 * dt.timedelta(days=1), "first": 0}
            conn.execute(_SEED, {**params, "count": history})
        if backlog:
            params = {"published": False, "age": dt.timedelta(hours=1), "first": history}
            conn.execute(_SEED, {**params, "count": backlog})
    _sql(
        engine,
        "DROP TABLE IF EXISTS outbox_template",
        "CREATE TABLE outbox_template AS SELECT * FROM outbox",
    )


def _restore(engine: Engine) -> None:
    _sql(
        engine,
        "TRUNCATE outbox",
        "INSERT INTO outbox SELECT * FROM outbox_template",
        "VACUUM ANALYZE outbox",
        "CHECKPOINT",
    )


def _timed_batches(engine: Engine, batch_size: int) -> tuple[int, float, float]:
    """Purge as ``outbox.purge`` does, timing each batch: rows, seconds, longest batch."""
    with engine.begin() as conn:
        cutoff = retention.purge_cutoff(conn, WEEK)
    rows, longest = 0, 0.0
    started = time.perf_counter()
    batches = retention.purge_batches(engine, cutoff, batch_size)
    while True:
        batch_started = time.perf_counter()
        deleted = next(batches, None)
        if deleted is None:
            break
        longest = max(longest, time.perf_counter() - batch_started)
        rows += deleted
    return rows, time.perf_counter() - started, longest


def _purge_rates(
    engine: Engine, rounds: int, sizes: Sequence[int]
) -> dict[int, list[tuple[float, float]]]:
    results: dict[int, list[tuple[float, float]]] = {size: [] for size in sizes}
    for round_ in range(rounds):
        for size in sizes if round_ % 2 == 0 else list(reversed(sizes)):
            _restore(engine)
            rows, seconds, longest = _timed_batches(engine, size)
            assert rows == HISTORY, rows
            results[size].append((rows / seconds, longest))
    return results


class _Clocked:
    """A publisher that records when each message went out."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, _message: object) -> None:
        self.times.append(time.perf_counter())

    def rate(self, start: float, end: float) -> float:
        return sum(start <= t <= end for t in self.times) / (end - start)


WARM_UP = 5_000  # messages published before the window opens
_LAST_PURGE = [1.0]  # seconds the last purge beside a drain took: the window without one


def _drain_beside(engine: Engine, purge: bool) -> tuple[float, float, float]:
    """Drain the backlog; once ``WARM_UP`` messages are out, purge the history in another thread
    (or, without ``purge``, wait as long as the last purge took). Returns the drain's rate inside
    that window, over the whole drain, and the purge's rate (0 without one)."""
    _restore(engine)
    publisher = _Clocked()
    relay = outbox.Relay(engine, publisher, batch_size=100, poll_only=True)
    window: list[float] = []
    purged: list[int] = []

    def side() -> None:
        while len(publisher.times) < WARM_UP:
            time.sleep(0.001)  # a benchmark's poll, not a test's sync
        window.append(time.perf_counter())
        if purge:
            purged.append(outbox.purge(engine, older_than=WEEK, batch_size=10_000))
        else:
            time.sleep(_LAST_PURGE[0])
        window.append(time.perf_counter())

    thread = threading.Thread(target=side, daemon=True)
    thread.start()
    started = time.perf_counter()
    result = relay.drain()
    ended = time.perf_counter()
    thread.join(60)
    relay.close()
    assert result.published == BACKLOG, result
    assert window[1] < publisher.times[-1], "the drain ended before the purge did"
    seconds = window[1] - window[0]
    if purge:
        _LAST_PURGE[0] = seconds
    return (
        publisher.rate(window[0], window[1]),
        BACKLOG / (ended - started),
        purged[0] / seconds if purged else 0.0,
    )


def _drain(engine: Engine) -> float:
    _restore(engine)
    relay = outbox.Relay(engine, _noop, batch_size=100, poll_only=True)
    started = time.perf_counter()
    result = relay.drain()
    seconds = time.perf_counter() - started
    relay.close()
    assert result.published == BACKLOG, result
    return BACKLOG / seconds


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _spread(values: Sequence[float], unit: str = "rows/s") -> str:
    """``median (min-max) unit``."""
    return f"{_median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f}) {unit}"


def _ratios(above: Sequence[float], below: Sequence[float]) -> str:
    """The median of the per-round ratios ``above / below``, and their range."""
    ratios = [a / b for a, b in zip(above, below, strict=True)]
    return f"{_median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _alternate(rounds: int, arms: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    names = list(arms)
    samples: dict[str, list[Any]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else list(reversed(names)):
            samples[name].append(arms[name]())
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.purge", description=__doc__)
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1/postgres")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    admin = create_engine(args.url)
    name = "sqla_outbox_bench_purge"
    _sql(admin, f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
    url: URL = sa.make_url(args.url).set(database=name)
    engine = create_engine(url, utc=True)
    try:
        with engine.connect() as conn:
            version = conn.exec_driver_sql("SHOW server_version").scalar_one()
        print(f"PostgreSQL {version}, {args.rounds} rounds: median (min-max)")
        _create_table(engine, 3)
        _seed(engine, history=HISTORY, backlog=10_000)
        rates = _purge_rates(engine, args.rounds, [10_000, 1_000])
        for size, samples in rates.items():
            print(
                f"purge {HISTORY:,} published rows, batch {size:,}: "
                f"{_spread([r for r, _ in samples])}, longest batch "
                f"{_spread([1000 * b for _, b in samples], 'ms')}"
            )

        _create_table(engine, 3)
        _seed(engine, history=HISTORY, backlog=BACKLOG)
        _drain_beside(engine, purge=True)  # warm-up, and the window's length for "alone"
        beside = _alternate(
            args.rounds,
            {
                "alone": lambda: _drain_beside(engine, False),
                "purge": lambda: _drain_beside(engine, True),
            },
        )
        alone = [s[0] for s in beside["alone"]]
        purging = [s[0] for s in beside["purge"]]
        print(
            f"drain (batch 100) of {BACKLOG:,} over {HISTORY:,} published rows, in the purge's "
            f"window: alone {_spread(alone)}, beside a purge {_spread(purging)}, ratio "
            f"{_ratios(purging, alone)}"
        )
        print(
            f"  whole drain: alone {_spread([s[1] for s in beside['alone']])}, beside a purge "
            f"{_spread([s[1] for s in beside['purge']])}, ratio "
            f"{_ratios([s[1] for s in beside['purge']], [s[1] for s in beside['alone']])}"
        )
        purge_rates = [s[2] for s in beside["purge"]]
        print(f"  the purge (batch 10,000) beside the drain: {_spread(purge_rates)}")

        versions: dict[str, Callable[[], float]] = {}
        for version in (2, 3):

            def arm(version: int = version) -> float:
                _create_table(engine, version)
                _seed(engine, history=0, backlog=BACKLOG)
                return _drain(engine)

            versions[f"v{version}"] = arm
        drains = _alternate(args.rounds, versions)
        print(
            f"drain (batch 100) of {BACKLOG:,} rows: table version 2 {_spread(drains['v2'])}, "
            f"version 3 {_spread(drains['v3'])}, ratio {_ratios(drains['v3'], drains['v2'])}"
        )
    finally:
        engine.dispose()
        _sql(admin, f"DROP DATABASE IF EXISTS {name}")
        admin.dispose()

    with tempfile.TemporaryDirectory() as directory:
        lite = create_engine(f"sqlite:///{Path(directory) / 'outbox.sqlite3'}")
        outbox.metadata.create_all(lite)
        samples = []
        for _ in range(args.rounds):
            _seed_sqlite(lite)
            rows, seconds, longest = _timed_batches(lite, 10_000)
            assert rows == HISTORY, rows
            samples.append((rows / seconds, longest))
        print(
            f"SQLite: purge {HISTORY:,} published rows, batch 10,000: "
            f"{_spread([r for r, _ in samples])}, longest batch "
            f"{_spread([1000 * b for _, b in samples], 'ms')}"
        )
        lite.dispose()
    return 0


def _seed_sqlite(engine: Engine) -> None:
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
        for i in range(HISTORY)
    ]
    with engine.begin() as conn:
        conn.execute(sa.delete(outbox.OutboxRow.__table__))
        conn.execute(sa.insert(outbox.OutboxRow.__table__), rows)


if __name__ == "__main__":
    raise SystemExit(main())
