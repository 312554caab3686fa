"""Workload 5: does a claim slow down as the published history grows?

Two databases with the same schema, both holding the same backlog of ``backlog_rows``
unpublished rows (committed through ``outbox.enqueue``, ten per transaction):

* ``<db>``: nothing else (an empty history);
* ``<db>_history``: additionally ``history_rows`` published rows (1,000,000; 100,000 with
  ``--quick``), written in one ``INSERT ... SELECT generate_series`` with ``published_at`` set,
  time-ordered ids and timestamps older than the backlog, as years of traffic would leave them.

Both are ``VACUUM ANALYZE``d and checkpointed. Then claims of 100 rows alternate between the two
databases (and between the library's claim and the raw-SQL claim of
:data:`benchmarks.drain.RAW_CLAIM`), each timed alone and followed, untimed, by a mark of its
rows so the backlog drains the same way in both. The backlog is refilled before it runs low.

The library's claim is executed exactly as the relay runs it: the statement from
:func:`sqla_outbox.queries.claim_stmt` on an autocommit connection of the same engine. The
comparison is each claim against itself with and without history, so the baseline is the same
code on the same backlog: only the history differs. The raw-SQL row is informative.
"""

from __future__ import annotations

import datetime as dt
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from benchmarks.drain import RAW_CLAIM
from benchmarks.harness import (
    Context,
    Result,
    Target,
    fill_backlog,
    make_engine,
    recreate_database,
)
from sqla_outbox import queries

__all__ = ["history_url", "run"]

BATCH = 100

_HISTORY = """
INSERT INTO outbox (id, job, queue, input, idempotency_key, max_attempts, run_at, staged_at,
                    claimed_by, claimed_at, published_at, attempts)
SELECT id, 'send_receipt', 'default', jsonb_build_object('order_id', g), id::text, 3,
       t, t, 'history', t + interval '5 ms', t + interval '10 ms', 0
FROM (
    SELECT g,
           ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid AS id,
           now() - interval '30 days' + (g / 10) * interval '1 ms' AS t
    FROM generate_series(1, %s) AS g
) AS history
"""


_MARK_IDS = "UPDATE outbox SET published_at = now() WHERE id = ANY(%s)"
"""Untimed, after each claim: mark the claimed rows published, as a relay would."""


def history_url(url: URL) -> URL:
    """The second database of this workload (also dropped by ``__main__`` at the end)."""
    return url.set(database=f"{url.database}_history")


@dataclass
class _Side:
    """One database: its context, its autocommit engine (as the relay uses) and a raw connection."""

    ctx: Context
    autocommit: Engine
    conn: psycopg.Connection[tuple[Any, ...]]

    def refill(self, backlog: int) -> None:
        self.ctx.sql("DELETE FROM outbox WHERE claimed_by IS DISTINCT FROM 'history'")
        fill_backlog(self.ctx, backlog)
        self.ctx.sql("VACUUM ANALYZE outbox", "CHECKPOINT")

    def mark(self, ids: list[Any]) -> None:
        self.conn.execute(_MARK_IDS, (ids,))


def _library_claim(side: _Side) -> Callable[[], float]:
    claim = queries.claim_stmt(side.autocommit.dialect.name)
    lease = dt.timedelta(seconds=30)

    def run() -> float:
        token = f"lib:{secrets.token_hex(8)}"
        params = {"limit": BATCH, "lease": lease, "token": token}
        start = time.perf_counter()
        with side.autocommit.connect() as conn:
            rows = conn.execute(claim, params).all()
        elapsed = time.perf_counter() - start
        side.mark([row[0] for row in rows])
        return elapsed * 1000

    return run


def _raw_claim(side: _Side) -> Callable[[], float]:
    def run() -> float:
        token = f"raw:{secrets.token_hex(8)}"
        start = time.perf_counter()
        rows = side.conn.execute(RAW_CLAIM, (token, BATCH)).fetchall()
        elapsed = time.perf_counter() - start
        side.mark([row[0] for row in rows])
        return elapsed * 1000

    return run


def _plan(side: _Side) -> str:
    """EXPLAIN ANALYZE of the library's claim (rolled back, so it claims nothing)."""
    claim = queries.claim_stmt(side.autocommit.dialect.name)
    compiled = claim.compile(dialect=side.autocommit.dialect)
    params = {
        **compiled.params,
        "limit": BATCH,
        "lease": dt.timedelta(seconds=30),
        "token": "explain",
    }
    with side.ctx.raw(autocommit=False) as conn:
        rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}".encode(), params).fetchall()
        conn.rollback()
    return "\n".join(str(row[0]) for row in rows)


def _side(ctx: Context, url: URL, engine: Engine) -> _Side:
    side_ctx = Context(url=url, scale=ctx.scale, engine=engine, quick=ctx.quick, log=ctx.log)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    return _Side(side_ctx, autocommit, side_ctx.raw())


def run(ctx: Context) -> list[Result]:
    scale = ctx.scale
    ctx.clear_tables()
    hist_url = history_url(ctx.url)
    recreate_database(hist_url)
    hist_engine = make_engine(hist_url)
    empty = _side(ctx, ctx.url, ctx.engine)
    history = _side(ctx, hist_url, hist_engine)
    ctx.log(f"inserting {scale.history_rows:,} published rows (generate_series)")
    with history.ctx.raw() as conn:
        conn.execute(_HISTORY.encode(), (scale.history_rows,))
    arms: dict[str, Callable[[], float]] = {
        "library, history": _library_claim(history),
        "library, empty": _library_claim(empty),
        "raw SQL, history": _raw_claim(history),
        "raw SQL, empty": _raw_claim(empty),
    }
    samples: dict[str, list[float]] = {name: [] for name in arms}
    # Each iteration takes BATCH rows per arm; refill while at least half the backlog is left.
    per_fill = max(1, scale.backlog_rows // (2 * BATCH * 2))
    plan = ""
    ctx.log(f"{scale.claims} claims of {BATCH} per arm, alternating databases")
    try:
        for index in range(scale.claims):
            if index % per_fill == 0:
                for side in (empty, history):
                    side.refill(scale.backlog_rows)
                if not plan:
                    plan = _plan(history)
            names = list(arms) if index % 2 == 0 else list(reversed(arms))
            for name in names:
                samples[name].append(arms[name]())
    finally:
        for side in (empty, history):
            side.conn.close()
        hist_engine.dispose()
    label = f"{scale.history_rows:,}"
    return [
        _row(f"claim b={BATCH}, {label} published vs none", samples, "library", plan),
        _row(f"claim b={BATCH}, {label} published vs none: raw SQL", samples, "raw SQL", None),
    ]


def _row(name: str, samples: dict[str, list[float]], arm: str, plan: str | None) -> Result:
    with_history = samples[f"{arm}, history"]
    without = samples[f"{arm}, empty"]
    extra: dict[str, Any] = {
        "p90_ms": {
            "history": statistics.quantiles(with_history, n=10)[-1],
            "empty": statistics.quantiles(without, n=10)[-1],
        }
    }
    if plan is not None:
        extra["explain_analyze_history"] = plan
    return Result(
        name=name,
        unit="ms",
        ours=statistics.median(with_history),
        baseline=statistics.median(without),
        baseline_name="no history",
        targets=(Target("ratio", "<=", 1.5),) if plan is not None else (),
        samples={"history": with_history, "empty": without},
        extra=extra,
    )
