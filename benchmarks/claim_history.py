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

The library's claim is the relay's own (:class:`LibraryClaim`): its store's claim
(:mod:`sqla_outbox.stores`), on the connection the store holds across claims. The comparison is
each claim against itself with and without history, so the baseline is the same code on the
same backlog: only the history differs. The raw-SQL row is informative.
"""

from __future__ import annotations

import datetime as dt
import secrets
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine
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
from sqla_outbox.liveness import Liveness
from sqla_outbox.retries import (
    DEFAULT_MAX_PUBLISH_ATTEMPTS,
    DEFAULT_RETRY_BASE,
    DEFAULT_RETRY_MAX,
    resolve_retry_policy,
)
from sqla_outbox.stores import open_store, psycopg_sql

__all__ = [
    "BATCH",
    "ClaimSide",
    "LibraryClaim",
    "claim_side",
    "explain_claim",
    "history_url",
    "library_claim",
    "raw_claim",
    "run",
    "side_context",
]

BATCH = 100
LEASE = dt.timedelta(seconds=30)

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


class LibraryClaim:
    """The relay's claim, made as a relay makes it: the store a ``Relay`` on this engine opens
    (:func:`sqla_outbox.stores.open_store`), its ``claim()`` timed whole (statements, rows
    read, messages built), on the connection the store holds across claims.

    Call it with a token; it returns ``(seconds, parked, held, claimed ids)``.
    """

    def __init__(self, engine: Engine, batch: int = BATCH) -> None:
        self.batch = batch
        self.store = open_store(
            engine,
            relay_id="bench",
            order="key",
            batch_size=batch,
            claim_lease=LEASE,
            retry=resolve_retry_policy(
                DEFAULT_MAX_PUBLISH_ATTEMPTS, DEFAULT_RETRY_BASE, DEFAULT_RETRY_MAX
            ),
            liveness=Liveness(),
        )
        self._window = psycopg_sql.precompile(queries.window_stmt("postgresql"), engine.dialect)

    def __call__(self, token: str) -> tuple[float, int, int, list[Any]]:
        start = time.perf_counter()
        claimed = self.store.claim(token, None)
        elapsed = time.perf_counter() - start
        return elapsed, claimed.parked, claimed.held, [m.id for m in claimed.messages]

    @property
    def conn(self) -> Connection:
        """The connection the store holds across claims."""
        return self.store._held_connection()

    def afresh(self) -> None:
        """Forget what the last claims found, as a relay that just started."""
        self.store.start_over()

    def sql(self) -> tuple[str, dict[str, Any]]:
        """A claim's first window read and its parameters (for ``EXPLAIN``)."""
        params = {
            "window": self.batch,
            "after_staged_at": dt.datetime(1000, 1, 1, tzinfo=dt.timezone.utc),
            "after_id": uuid.UUID(int=0),
            "done": "explain",
            "lease": LEASE,
        }
        return self._window.text(params), self._window.params(params)

    def close(self) -> None:
        """Let go of the store's connection."""
        self.store.drop_connection()


def explain_claim(ctx: Context, claim: LibraryClaim) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of ``claim``'s next claim on ``ctx``'s database, with
    ``jit = off`` as on the relay's connection; rolled back, so it claims and parks nothing."""
    sql, params = claim.sql()
    with ctx.raw(autocommit=False) as conn:
        conn.execute(b"SET LOCAL jit = off")
        rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}".encode(), params).fetchall()
        conn.rollback()
    return "\n".join(str(row[0]) for row in rows)


@dataclass
class ClaimSide:
    """One database: its context, the library's claim (on the relay's kind of connection) and a
    raw psycopg connection for the baseline claim and the marks.

    ``backlog`` is the condition of the rows :meth:`refill` deletes before it writes a new
    backlog: everything but what the workload inserted to be there for good.
    """

    ctx: Context
    claim: LibraryClaim
    conn: psycopg.Connection[tuple[Any, ...]]
    backlog: str = "claimed_by IS DISTINCT FROM 'history'"

    def refill(self, backlog: int) -> None:
        self.ctx.sql(f"DELETE FROM outbox WHERE {self.backlog}")
        fill_backlog(self.ctx, backlog)
        self.ctx.sql("VACUUM ANALYZE outbox", "CHECKPOINT")

    def mark(self, ids: list[Any]) -> None:
        self.conn.execute(_MARK_IDS, (ids,))

    def close(self) -> None:
        self.claim.close()
        self.conn.close()


def library_claim(side: ClaimSide) -> Callable[[], float]:
    def run() -> float:
        elapsed, _parked, _held, ids = side.claim(f"lib:{secrets.token_hex(8)}")
        side.mark(ids)
        return elapsed * 1000

    return run


def raw_claim(side: ClaimSide) -> Callable[[], float]:
    def run() -> float:
        token = f"raw:{secrets.token_hex(8)}"
        start = time.perf_counter()
        rows = side.conn.execute(RAW_CLAIM, (token, BATCH)).fetchall()
        elapsed = time.perf_counter() - start
        side.mark([row[0] for row in rows])
        return elapsed * 1000

    return run


def side_context(ctx: Context, url: URL, engine: Engine) -> Context:
    """A :class:`Context` like ``ctx`` on another database of the suite."""
    return Context(url=url, scale=ctx.scale, engine=engine, quick=ctx.quick, log=ctx.log)


def claim_side(ctx: Context, url: URL, engine: Engine, **fields: Any) -> ClaimSide:
    """A :class:`ClaimSide` on the database ``url`` (``engine`` is the suite's engine on it)."""
    side_ctx = side_context(ctx, url, engine)
    claim = LibraryClaim(engine)
    return ClaimSide(side_ctx, claim, side_ctx.raw(), **fields)


def run(ctx: Context) -> list[Result]:
    scale = ctx.scale
    ctx.clear_tables()
    hist_url = history_url(ctx.url)
    recreate_database(hist_url)
    hist_engine = make_engine(hist_url)
    empty = claim_side(ctx, ctx.url, ctx.engine)
    history = claim_side(ctx, hist_url, hist_engine)
    ctx.log(f"inserting {scale.history_rows:,} published rows (generate_series)")
    with history.ctx.raw() as conn:
        conn.execute(_HISTORY.encode(), (scale.history_rows,))
    arms: dict[str, Callable[[], float]] = {
        "library, history": library_claim(history),
        "library, empty": library_claim(empty),
        "raw SQL, history": raw_claim(history),
        "raw SQL, empty": raw_claim(empty),
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
                    plan = explain_claim(history.ctx, history.claim)
            names = list(arms) if index % 2 == 0 else list(reversed(arms))
            for name in names:
                samples[name].append(arms[name]())
    finally:
        for side in (empty, history):
            side.close()
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
