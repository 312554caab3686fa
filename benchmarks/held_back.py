"""Workload 8: does a claim slow down when dead letters hold back thousands of rows ahead of it?

Two databases with the same schema, both holding the same backlog of ``backlog_rows`` due,
keyless rows (committed through ``outbox.enqueue``, ten per transaction):

* ``<db>``: nothing else;
* ``<db>_held``: additionally, ahead of the backlog in claim order (older ``staged_at``),
  :data:`HELD_ROWS` rows no claim may take, written in one ``INSERT ... SELECT
  generate_series`` with time-ordered ids: :data:`DEAD_LETTERS` blocks of
  :data:`BLOCK` rows, each

  - a **dead letter** (``dead_at`` set, ``attempts`` 3, ``last_error``) with an ordering key
    of its own,
  - :data:`SAME_TRANSACTION` - 1 rows of the dead letter's transaction (same ``staged_at``, no
    key), held back by the transaction,
  - the rest of the block: later rows of the dead letter's ordering key, held back by the key.

Both are ``VACUUM ANALYZE``d and checkpointed. Then, untimed, the library's claim runs on each
database until it stops parking rows, every claimed row marked published: the steady state
of a relay that has met the dead letters. A relay gets there within a few claims; the
measured claims see what it sees from then on.

Then claims of :data:`~benchmarks.claim_history.BATCH` rows alternate between the two
databases, each timed alone and followed, untimed, by a mark of its rows, as in
:mod:`benchmarks.claim_history`. The library's claim is the relay's own
(:class:`~benchmarks.claim_history.LibraryClaim`: its store's claim, on the connection the
store holds across claims). The comparison is the claim against itself
with and without the held rows: only those differ. The backlog is refilled (the held rows stay,
parked) before it runs low.

Last, the plan an idle relay makes of its wait (:func:`sqla_outbox.queries.idle_stmt`, on the
claim's connection) alternates between the two databases once the unclaimed backlog is deleted
from both: the promise is the claim's, that held rows a relay cannot publish cost it nothing
(target: the same 1.5x). :data:`IDLE_PLANS` plans each; the JSON keeps the plan on
``<db>_held``.

Informative rows, against the steady claim without held rows:

* the first claim on ``<db>_held``, before anything is parked (every held row unparked and the
  table vacuumed again, :data:`FIRST_CLAIMS` times, once with ``--quick``);
* the slowest claim of the parking that follows: each claim parks what its windows read, up
  to :data:`sqla_outbox.plan.MOST_READ_BATCHES` batches, until every held row is parked (their
  times and parked rows are in the JSON, with the claims and seconds the parking took);
* the library's claim against the raw-SQL claim (:data:`benchmarks.drain.RAW_CLAIM`) on the
  database without held rows. The raw claim cannot run on ``<db>_held``: it knows no dead
  letters and would take them;
* the hand-written claim that keeps order by probing instead of parking
  (:func:`benchmarks.raw_failures.probing_claim` with keys and dead letters, the claim of
  workload 9's floor), on ``<db>_held`` against itself on ``<db>``: it ignores ``parked`` and
  reads every held row on every claim, so this is what not parking costs once held rows are
  many. It must never take a held row (checked on every claim).

The JSON keeps ``EXPLAIN (ANALYZE, BUFFERS)`` of the first claim and of one steady-state claim
on ``<db>_held`` (both rolled back).
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL

from benchmarks.claim_history import (
    BATCH,
    ClaimSide,
    claim_side,
    explain_claim,
    library_claim,
    raw_claim,
)
from benchmarks.harness import Context, Result, Target, make_engine, recreate_database
from benchmarks.held_rows import (
    BLOCK,
    DEAD_LETTERS,
    HELD_JOB,
    HELD_ROWS,
    INSERT_HELD,
    SAME_TRANSACTION,
    UNPARK_HELD,
)
from benchmarks.raw_failures import probing_claim
from sqla_outbox import queries

__all__ = ["BLOCK", "DEAD_LETTERS", "HELD_ROWS", "SAME_TRANSACTION", "held_url", "run"]

IDLE_PLANS = 400
"""Idle plans timed per database (alternating), after the claims: 100 with ``--quick``."""
FIRST_CLAIMS = 3
"""How many times the held rows are unparked to time a first claim and the parking."""
SETTLE_LIMIT = 1000
"""Claims the untimed settling may take before the workload gives up on a steady state."""

_PROBING = probing_claim(keys=True, dead=True)
_JOB = 1  # the claimed rows' columns are queries.MESSAGE_FIELDS: id, job, ...


def _probing_claim(side: ClaimSide) -> Callable[[], float]:
    """The hand-written claim that skips held rows by probing instead of parking them
    (:func:`benchmarks.raw_failures.probing_claim`, with keys and dead letters), timed alone
    and followed, untimed, by a mark of its rows; it must never take a held row."""

    def run() -> float:
        token = f"probe:{secrets.token_hex(8)}"
        start = time.perf_counter()
        rows = side.conn.execute(_PROBING, {"token": token, "batch": BATCH}).fetchall()
        elapsed = time.perf_counter() - start
        if any(row[_JOB] == HELD_JOB for row in rows):
            raise RuntimeError("the probing claim took a held row")
        side.mark([row[0] for row in rows])
        return elapsed * 1000

    return run


def _idle_plans(none: ClaimSide, held: ClaimSide, backlog: str, plans: int) -> dict[str, Any]:
    """The idle relay's plan of its wait (:func:`sqla_outbox.queries.idle_stmt`), sent as the
    relay sends it (SQLAlchemy, on the claim's held connection), ``plans`` times per database,
    alternating, once the unclaimed backlog is gone from both: what is left is the published
    history of the claims and, on ``<db>_held``, the held rows. Milliseconds per plan, and the
    plan on ``<db>_held``."""
    for side in (none, held):
        side.ctx.sql(
            f"DELETE FROM outbox WHERE {backlog} AND published_at IS NULL",
            "VACUUM ANALYZE outbox",
            "CHECKPOINT",
        )
    plan = queries.idle_stmt("postgresql")
    times: dict[str, list[float]] = {"held": [], "none": []}
    for index in range(plans):
        order = ((none, "none"), (held, "held"))
        for side, name in order if index % 2 == 0 else reversed(order):
            start = time.perf_counter()
            side.claim.conn.execute(plan).one()
            times[name].append((time.perf_counter() - start) * 1000)
    sql = plan.compile(dialect=held.claim.conn.dialect)
    explained = held.claim.conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {sql}").all()
    return {**times, "explain_analyze_held": "\n".join(str(row[0]) for row in explained)}


def held_url(url: URL) -> URL:
    """The second database of this workload (also dropped by ``__main__`` at the end)."""
    return url.set(database=f"{url.database}_held")


def _settle(side: ClaimSide) -> list[tuple[int, float, int]]:
    """Claim (untimed, marking what is claimed) until a claim parks nothing.

    Returns, per claim made: its window, its milliseconds and the rows it parked.
    """
    claims: list[tuple[int, float, int]] = []
    while len(claims) < SETTLE_LIMIT:
        window = side.claim.batch
        elapsed, parked, _held, ids = side.claim(f"settle:{secrets.token_hex(8)}")
        side.mark(ids)
        claims.append((window, elapsed * 1000, parked))
        if not parked:
            return claims
    raise RuntimeError(f"the claim still parked rows after {SETTLE_LIMIT} claims")


def _first_claims(held: ClaimSide, times: int) -> dict[str, Any]:
    """Time the first claim over freshly unparked held rows, and the parking, ``times`` times.

    Each time every held row is unparked and the table vacuumed, analysed and checkpointed (as
    when a relay first meets the dead letters), the window starts at the batch, and the claims
    run until one parks nothing. The first claim is the first of those.
    """
    first: list[float] = []
    claims: list[int] = []
    seconds: list[float] = []
    parked: list[int] = []
    slowest: list[float] = []
    each: list[tuple[int, float, int]] = []
    plan = ""
    for _ in range(times):
        held.ctx.sql(UNPARK_HELD, "VACUUM ANALYZE outbox", "CHECKPOINT")
        held.claim.afresh()
        if not plan:
            plan = explain_claim(held.ctx, held.claim)
        each = _settle(held)
        first.append(each[0][1])
        claims.append(len(each))
        seconds.append(sum(ms for _window, ms, _parked in each) / 1000)
        parked.append(sum(rows for _window, _ms, rows in each))
        slowest.append(max(ms for _window, ms, _parked in each))
    return {
        "first_claim_ms": first,
        "claims_to_steady_state": claims,
        "seconds_to_steady_state": seconds,
        "rows_parked": parked,
        "slowest_parking_claim_ms": slowest,
        "last_parking_claims_window_ms_parked": each,
        "explain_analyze_first_claim": plan,
    }


def run(ctx: Context) -> list[Result]:
    scale = ctx.scale
    ctx.clear_tables()
    url = held_url(ctx.url)
    recreate_database(url)
    held_engine = make_engine(url)
    backlog = f"job <> '{HELD_JOB}'"
    none = claim_side(ctx, ctx.url, ctx.engine, backlog=backlog)
    held = claim_side(ctx, url, held_engine, backlog=backlog)
    ctx.log(
        f"inserting {HELD_ROWS:,} held rows: {DEAD_LETTERS} dead letters, each with "
        f"{SAME_TRANSACTION - 1} rows of its transaction and {BLOCK - SAME_TRANSACTION} of its key"
    )
    with held.ctx.raw() as conn:
        conn.execute(INSERT_HELD.encode())
    held_arm = library_claim(held)
    arms: dict[str, Callable[[], float]] = {
        "library, held": held_arm,
        "library, none": library_claim(none),
        "raw SQL, none": raw_claim(none),
        "probing, held": _probing_claim(held),
        "probing, none": _probing_claim(none),
    }
    samples: dict[str, list[float]] = {name: [] for name in arms}
    # Each iteration takes BATCH rows per arm; refill while at least half the backlog is left.
    per_fill = max(1, scale.backlog_rows // (2 * BATCH * 2))
    first: dict[str, Any] = {}
    plan = ""
    try:
        for index in range(scale.claims):
            if index % per_fill == 0:
                for side in (none, held):
                    side.refill(scale.backlog_rows)
                if not first:
                    times = 1 if ctx.quick else FIRST_CLAIMS
                    ctx.log(f"first claims over the held rows, and their parking ({times}x)")
                    first = _first_claims(held, times)
                    ctx.log(f"{scale.claims} claims of {BATCH} per arm, alternating databases")
                for side in (none, held):
                    _settle(side)
                if not plan:
                    plan = explain_claim(held.ctx, held.claim)
            names = list(arms) if index % 2 == 0 else list(reversed(arms))
            for name in names:
                samples[name].append(arms[name]())
        plans = 100 if ctx.quick else IDLE_PLANS
        ctx.log(f"{plans} idle plans per database, the backlogs gone, alternating databases")
        idle = _idle_plans(none, held, backlog, plans)
    finally:
        for side in (none, held):
            side.close()
        held_engine.dispose()
    held_samples, none_samples = samples["library, held"], samples["library, none"]
    raw_samples = samples["raw SQL, none"]
    probing_held, probing_none = samples["probing, held"], samples["probing, none"]
    return [
        Result(
            name=f"claim b={BATCH}, {HELD_ROWS:,} held-back or dead rows ahead vs none",
            unit="ms",
            ours=statistics.median(held_samples),
            baseline=statistics.median(none_samples),
            baseline_name="none held",
            targets=(Target("ratio", "<=", 1.5),),
            samples={"held": held_samples, "none": none_samples},
            paired_ratio=_paired(held_samples, none_samples),
            extra={
                "p90_ms": {"held": _p90(held_samples), "none": _p90(none_samples)},
                "explain_analyze_held": plan,
            },
        ),
        Result(
            name=f"claim b={BATCH}, first claim over {HELD_ROWS:,} held rows (parking)",
            unit="ms",
            ours=statistics.median(first["first_claim_ms"]),
            baseline=statistics.median(none_samples),
            baseline_name="steady, none held",
            samples={"first": first["first_claim_ms"], "none": none_samples},
            extra={"explain_analyze_first_claim": first["explain_analyze_first_claim"]},
        ),
        Result(
            name=(
                f"claim b={BATCH}, parking {HELD_ROWS:,} held rows: slowest of "
                f"{max(first['claims_to_steady_state'])} claims"
            ),
            unit="ms",
            ours=statistics.median(first["slowest_parking_claim_ms"]),
            baseline=statistics.median(none_samples),
            baseline_name="steady, none held",
            samples={"slowest": first["slowest_parking_claim_ms"]},
            extra={
                key: value
                for key, value in first.items()
                if key not in ("first_claim_ms", "explain_analyze_first_claim")
            },
        ),
        Result(
            name=f"idle plan, {HELD_ROWS:,} held-back or dead rows vs none",
            unit="ms",
            ours=statistics.median(idle["held"]),
            baseline=statistics.median(idle["none"]),
            baseline_name="none held",
            targets=(Target("ratio", "<=", 1.5),),
            samples={"held": idle["held"], "none": idle["none"]},
            paired_ratio=_paired(idle["held"], idle["none"]),
            extra={"explain_analyze_held": idle["explain_analyze_held"]},
        ),
        _claims_row(
            f"claim b={BATCH}, none held: library vs raw SQL",
            ("library", none_samples),
            ("raw SQL", raw_samples),
        ),
        _claims_row(
            f"claim b={BATCH}, {HELD_ROWS:,} held rows ahead vs none: "
            "raw SQL that probes instead of parking",
            ("held", probing_held),
            ("none held", probing_none),
        ),
    ]


def _claims_row(
    name: str, ours: tuple[str, list[float]], baseline: tuple[str, list[float]]
) -> Result:
    """An informative row of claim times: medians, and the paired ratio of the iterations."""
    (ours_name, ours_ms), (baseline_name, baseline_ms) = ours, baseline
    return Result(
        name=name,
        unit="ms",
        ours=statistics.median(ours_ms),
        baseline=statistics.median(baseline_ms),
        baseline_name=baseline_name,
        samples={ours_name: ours_ms, baseline_name: baseline_ms},
        paired_ratio=_paired(ours_ms, baseline_ms),
    )


def _paired(ours: list[float], baseline: list[float]) -> float:
    """The median of the per-iteration ratios (the two claims of an iteration ran together)."""
    return statistics.median(a / b for a, b in zip(ours, baseline, strict=True))


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
