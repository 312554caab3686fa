"""Workload 10: does a drain slow down when rows not due yet lie ahead of the due ones?

Rows that are not due yet (a message scheduled for later, ``run_at`` in the future; a failed
one waiting out its retry backoff, ``retry_at`` in the future) are neither held back nor dead.
Left in the claim's index (``ix_outbox_claimable``), as on a table before version 4, each of them
costs every claim a step through the table on every pass, however far off it is due. So a
relay's sweep (:mod:`sqla_outbox.waiting`, every
:data:`~sqla_outbox.sweeping.SWEEP_INTERVAL` seconds, busy or idle) parks the rows among the
first :data:`~sqla_outbox.waiting.HEAD_ROWS` of that index that come due more than
:data:`~sqla_outbox.waiting.PARK_AHEAD` from now, until they are due (``wake_at``), and wakes
them :data:`~sqla_outbox.waiting.WAKE_AHEAD` before. This workload prices what is left.

Every arm is a drain by the library's relay, as workload 3's ``ours`` (:mod:`benchmarks.drain`):
``Relay(engine, publisher, batch_size=100, relay_id="ours", poll_interval=0.01).drain()``, timed
alone, on a freshly opened pool connection, of the drain snapshot (``drain_rows`` due, keyless
rows committed through ``outbox.enqueue``, ten per transaction), with ahead of it in claim
order (``staged_at`` a day old, time-ordered ids, one ``INSERT ... SELECT generate_series``,
job :data:`NOT_DUE_JOB`, each row its own transaction, no key):

* **none** (the baseline): nothing;
* **scheduled**: :data:`NOT_DUE_ROWS` rows scheduled a day ahead (``run_at = now() + 1 day``);
* **backing off**: :data:`NOT_DUE_ROWS` rows in a day's retry backoff (``attempts`` 1,
  ``last_error`` ``'refused'``, ``retry_at = now() + 1 day``; ``run_at`` their staging time),
  what a queue whose every message a broker refuses becomes once each has failed once;
* **scheduled, not swept** and **backing off, not swept** (informative): the same rows left in
  the claim's index, as on a table before version 4: what parking them saves. The relay of these
  arms has its sweeps turned off (:class:`_Unswept`, its ``_sweep`` a no-op): a drain of them
  outlasts a sweep interval, and the relay's own busy sweep would otherwise park the rows
  mid-drain. (That also turns off its sweep for held-back rows, which, with nothing held back,
  would find nothing.) Each such drain is checked to leave every row unparked.

Before each drain, untimed: the snapshot restored, the rows added, ``VACUUM ANALYZE`` and
``CHECKPOINT`` (as workload 3's held-rows arm); then, in the swept arms and the baseline, ONE
sweep as a running relay makes it (``Relay._statements.sweep()``, the one statement of
:func:`sqla_outbox.queries.sweep_stmt`, from a relay of its own): the steady state of a relay
that has swept once, which a relay reaches within a sweep interval of meeting the rows. It is
untimed because a relay pays it once every sweep interval, not once a drain, and the row is
about the passes; its own time is reported (informative row, and the JSON). The sweep is
checked to have parked every row not due, each with ``wake_at`` its due time (and, in the
baseline, nothing); then ``CHECKPOINT`` again, so no arm's drain starts with the sweep's dirty
pages. Nothing is vacuumed after the sweep: the old row versions are still in the indexes, as a
relay finds the table until autovacuum comes by (this server runs with ``autovacuum = off``, so
here it never does).

Why the sweep analyses the table (:mod:`sqla_outbox.analyzing`). With statistics from before
the sweep, the planner believes two paths cost the same where the rows parked make all the
difference, and picks one by accident:

* the claim locks its rows (``FOR UPDATE``), so PostgreSQL keeps in its filter every
  condition, even those ``ix_outbox_claimable``'s predicate implies, and a scan of
  ``ix_outbox_claimable`` and one of ``ix_outbox_unpublished`` (same columns, same order) cost
  the same while both are believed to hold the same rows; of the two it keeps the index
  created last (the higher OID), an accident of how the table was made (``metadata.create_all``
  creates them in a set's order, different from one process to the next). Parked, the rows not
  due are out of ``ix_outbox_claimable`` only: a claim reading ``ix_outbox_unpublished`` steps
  over every one of them;
* the gate's probe for parked rows of each candidate's transaction reads either
  ``ix_outbox_parked_group`` (``staged_at`` where parked: nothing to read) or
  ``ix_outbox_parked_key`` (``ordering_key`` where parked: every parked row, filtered on
  ``staged_at``, once per transaction among the candidates), both believed empty.

Without the analysis (and with the indexes in an upgrade's order) each round's speed follows
whichever index the gate's probe happens to read, and a claim may read every parked row on
every pass. So a sweep that moves rows in thousands analyses the table itself, and the sweep
here is the relay's own. Which index the claim's candidates scan and its gate's transaction
probe read is taken from a plain ``EXPLAIN`` of the relay's first claim (``fast_claim_stmt()``,
``jit = off``) before every drain of a swept arm, into the JSON
(``candidates_index_per_round``, ``parked_probe_index_per_round``).

After each drain it is checked that the publisher received every row of the snapshot exactly
once and nothing else, that every row of the snapshot is published and none of the rows not
due; the JSON also has, per round, how many of those were still parked.

Arms interleave per round (:func:`~benchmarks.harness.interleave`, ``drain_rounds`` rounds).
Targets: each swept arm against none, rows/s, ratio >= 0.9, the target
of workload 3's ``10,000 rows held behind 100 dead letters vs none``: rows a relay cannot
publish yet must cost the others next to nothing. (Workload 8's target for a single claim
with 10,000 held-back or dead rows ahead is at most 1.5 times the claim with none; a drain is
claims and marks, and the mark does not see these rows.)
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqla_outbox as outbox
from benchmarks.drain import _drain_relay, _library_sql, _prepare
from benchmarks.harness import (
    Context,
    Result,
    Target,
    compare,
    interleave,
    restore_outbox,
)
from sqla_outbox import waiting
from sqla_outbox.sweeping import Swept

__all__ = ["NOT_DUE_JOB", "NOT_DUE_ROWS", "run"]

BATCH_SIZE = 100
POLL_INTERVAL = 0.01
NOT_DUE_ROWS = 10_000
NOT_DUE_JOB = "not_due"
TARGET_RATIO = 0.9
"""Workload 3's target for ``drain b=100, 10,000 rows held behind 100 dead letters vs none``."""


def _insert_not_due(run_at: str, attempts: int, last_error: str, retry_at: str) -> str:
    """:data:`NOT_DUE_ROWS` rows staged a day ago, a millisecond apart, each its own
    transaction, with time-ordered (UUIDv7-shaped) ids, ``t`` being the row's staging time."""
    return f"""
INSERT INTO outbox (id, job, queue, input, idempotency_key, max_attempts, run_at, staged_at,
                    attempts, last_error, retry_at)
SELECT id, '{NOT_DUE_JOB}', 'default', jsonb_build_object('order_id', g), id::text, 3, {run_at}, t,
       {attempts}, {last_error}, {retry_at}
FROM (
    SELECT g, t,
           (substr(ms, 1, 8) || '-' || substr(ms, 9, 4) || '-7000-8000-'
            || lpad(to_hex(g), 12, '0'))::uuid AS id
    FROM (
        SELECT g, t, lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') AS ms
        FROM (
            SELECT g, date_trunc('second', now()) - interval '1 day' + g * interval '1 ms' AS t
            FROM generate_series(0, {NOT_DUE_ROWS - 1}) AS g
        ) AS placed
    ) AS stamped
) AS not_due
"""


INSERT_SCHEDULED = _insert_not_due("now() + interval '1 day'", 0, "NULL", "NULL")
"""Rows scheduled a day ahead."""
INSERT_BACKING_OFF = _insert_not_due("t", 1, "'refused'", "now() + interval '1 day'")
"""Rows failed once, in a retry backoff of a day."""

_CHECK_SWEPT = f"""
SELECT count(*) FILTER (WHERE job = '{NOT_DUE_JOB}'),
       count(*) FILTER (WHERE job = '{NOT_DUE_JOB}' AND parked AND wake_at IS NOT NULL
                        AND wake_at = CASE WHEN retry_at > run_at THEN retry_at ELSE run_at END),
       count(*) FILTER (WHERE job <> '{NOT_DUE_JOB}' AND parked)
FROM outbox
"""
_CHECK_DRAINED = f"""
SELECT count(*) FILTER (WHERE job <> '{NOT_DUE_JOB}' AND published_at IS NULL),
       count(*) FILTER (WHERE job = '{NOT_DUE_JOB}'),
       count(*) FILTER (WHERE job = '{NOT_DUE_JOB}' AND published_at IS NOT NULL),
       count(*) FILTER (WHERE job = '{NOT_DUE_JOB}' AND parked)
FROM outbox
"""
_CANDIDATES_SCAN = re.compile(r"CTE candidates\n(?:.*\n)*?.*Index (?:Only )?Scan using (\w+)")
_PARKED_PROBE = re.compile(r"Index (?:Only )?Scan using (\w+) on outbox parked_staged_at\b")


@dataclass(frozen=True, slots=True)
class _Arm:
    """One arm: what lies ahead of the backlog, and whether a sweep ran before the drain."""

    insert: str
    swept: bool
    sweeps_ms: list[float] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    parked_after: list[int] = field(default_factory=list)
    candidates_index: list[str] = field(default_factory=list)
    parked_probe_index: list[str] = field(default_factory=list)
    plans: list[str] = field(default_factory=list)


class _Unswept(outbox.Relay):
    """The relay with its sweeps turned off: the rows not due stay in the claim's index for the
    whole drain, as on a table before version 4 (see the module's docstring)."""

    def _sweep(self) -> bool:
        return False


NONE = "none"
SCHEDULED = f"{NOT_DUE_ROWS:,} scheduled a day ahead"
BACKING_OFF = f"{NOT_DUE_ROWS:,} in a day's retry backoff"
UNSWEPT = ", not swept"


def _sweep_once(ctx: Context, arm: _Arm) -> None:
    """One sweep as a running relay makes it, untimed in the drain; checked."""
    sweeper = outbox.Relay(ctx.engine, _refuse, batch_size=BATCH_SIZE, relay_id="sweeper")
    try:
        start = time.perf_counter()
        swept: Swept = sweeper._statements.sweep()
        arm.sweeps_ms.append((time.perf_counter() - start) * 1000)
    finally:
        sweeper.close()
    with ctx.raw() as conn:
        rows, parked, due_parked = conn.execute(_CHECK_SWEPT.encode()).fetchone()  # type: ignore[misc]
    if swept != Swept(0, 0, rows) or parked != rows or due_parked:
        raise RuntimeError(
            f"one sweep over {rows:,} rows not due: {swept}; {parked:,} of them parked with "
            f"wake_at their due time, {due_parked:,} due rows parked (expected every row not "
            "due and no due row)"
        )


def _refuse(_message: object) -> None:
    raise AssertionError("the sweeping relay publishes nothing")


def _explain_claim(ctx: Context, arm: _Arm) -> None:
    """Plain ``EXPLAIN`` (nothing runs, nothing changes) of the relay's first claim of a drain:
    the fast claim, ``jit = off``; which index its candidates scan reads, and the plan."""
    claim, _merged = _library_sql(ctx)
    params = claim.params(
        {
            "limit": BATCH_SIZE,
            "lease": dt.timedelta(seconds=30),
            "token": "explain",
            "whole": False,
        }
    )
    with ctx.raw(autocommit=False) as conn:
        conn.execute(b"SET LOCAL jit = off")
        rows = conn.execute(f"EXPLAIN {claim.text(params)}".encode(), params).fetchall()
        conn.rollback()
    plan = "\n".join(str(row[0]) for row in rows)
    found = _CANDIDATES_SCAN.search(plan)
    arm.candidates_index.append(found.group(1) if found else "?")
    probe = _PARKED_PROBE.search(plan)
    arm.parked_probe_index.append(probe.group(1) if probe else "?")
    if not arm.plans:
        arm.plans.append(plan)


def _drain(ctx: Context, arm: _Arm, expected: set[int]) -> float:
    """Restore, add the rows not due, sweep once (or not), then the timed drain; rows/s."""
    restore_outbox(ctx)
    ctx.sql(*((arm.insert,) if arm.insert else ()), "VACUUM ANALYZE outbox", "CHECKPOINT")
    if arm.swept:
        _sweep_once(ctx, arm)
        _explain_claim(ctx, arm)
        ctx.sql("CHECKPOINT")
    seen: list[int] = []

    def publish(message: outbox.OutboxMessage) -> None:
        seen.append(message.id.int)

    relay_type = outbox.Relay if arm.swept else _Unswept
    published, elapsed = _drain_relay(
        ctx, BATCH_SIZE, publish=publish, relay_type=relay_type, poll_interval=POLL_INTERVAL
    )
    _check_drained(ctx, arm, published, seen, expected)
    arm.published.append(published)
    return published / elapsed


def _check_drained(
    ctx: Context, arm: _Arm, published: int, seen: list[int], expected: set[int]
) -> None:
    with ctx.raw() as conn:
        row = conn.execute(_CHECK_DRAINED.encode()).fetchone()
    left, rows, not_due_published, parked = row  # type: ignore[misc]
    problems = []
    if published != len(expected) or len(seen) != len(expected) or set(seen) != expected:
        extra = len(set(seen) - expected)
        problems.append(
            f"drain() said {published:,} published, the publisher got {len(seen):,} "
            f"({len(set(seen)):,} distinct, {extra:,} not of the backlog) of {len(expected):,}"
        )
    if left:
        problems.append(f"{left:,} rows of the backlog left unpublished")
    if not_due_published:
        problems.append(f"{not_due_published:,} of the {rows:,} rows not due published")
    if not arm.swept and parked:
        problems.append(f"{parked:,} rows not due parked by a relay that does not sweep")
    if problems:
        raise RuntimeError("; ".join(problems))
    arm.parked_after.append(parked)


def _expected_ids(ctx: Context) -> set[int]:
    with ctx.raw() as conn:
        return {row[0].int for row in conn.execute(b"SELECT id FROM outbox_template")}


def _rate_arm(ctx: Context, arm: _Arm, expected: set[int]) -> Callable[[], float]:
    def run() -> float:
        return _drain(ctx, arm, expected)

    return run


def run(ctx: Context) -> list[Result]:
    """Drains of the snapshot with 10,000 rows not due ahead, swept once or not, against none."""
    _prepare(ctx)
    expected = _expected_ids(ctx)
    arms = {
        NONE: _Arm("", swept=True),
        SCHEDULED: _Arm(INSERT_SCHEDULED, swept=True),
        BACKING_OFF: _Arm(INSERT_BACKING_OFF, swept=True),
        SCHEDULED + UNSWEPT: _Arm(INSERT_SCHEDULED, swept=False),
        BACKING_OFF + UNSWEPT: _Arm(INSERT_BACKING_OFF, swept=False),
    }
    ctx.log(
        f"drain b={BATCH_SIZE} of {len(expected):,} rows with {NOT_DUE_ROWS:,} not due ahead: "
        f"{' / '.join(arms)}, interleaved"
    )
    samples = interleave(
        {name: _rate_arm(ctx, arm, expected) for name, arm in arms.items()},
        ctx.scale.drain_rounds,
    )

    def row(name: str, label: str, *targets: Target) -> Result:
        arm = arms[name]
        extra: dict[str, Any] = {
            "published_per_round": {name: arm.published, NONE: arms[NONE].published},
            "not_due_parked_after_drain": arm.parked_after,
        }
        if arm.swept:
            extra |= {
                "sweep_ms": arm.sweeps_ms,
                "candidates_index_per_round": arm.candidates_index,
                "parked_probe_index_per_round": arm.parked_probe_index,
                "explain_first_claim": arm.plans[0],
            }
        return compare(
            f"drain b={BATCH_SIZE}, {label} vs none",
            "rows/s",
            samples,
            name,
            NONE,
            *targets,
            **extra,
        )

    target = Target("ratio", ">=", TARGET_RATIO)
    scheduled = f"{NOT_DUE_ROWS:,} rows scheduled a day ahead"
    backing_off = f"{NOT_DUE_ROWS:,} rows in a day's retry backoff"
    return [
        row(SCHEDULED, scheduled, target),
        row(BACKING_OFF, backing_off, target),
        row(SCHEDULED + UNSWEPT, f"{scheduled}, not swept (before schema 4)"),
        row(BACKING_OFF + UNSWEPT, f"{backing_off}, not swept (before schema 4)"),
        _sweep_row(arms),
    ]


def _sweep_row(arms: dict[str, _Arm]) -> Result:
    """Informative: the untimed sweep that parked the rows not due, against the same sweep with
    nothing to park (the baseline's)."""
    parking = {name: arm.sweeps_ms for name, arm in arms.items() if arm.swept and name != NONE}
    idle = arms[NONE].sweeps_ms
    extra: dict[str, Any] = {
        "head_rows": waiting.HEAD_ROWS,
        "park_ahead_s": waiting.PARK_AHEAD.total_seconds(),
        "wake_ahead_s": waiting.WAKE_AHEAD.total_seconds(),
    }
    return Result(
        name=f"one sweep parking {NOT_DUE_ROWS:,} rows not due (untimed in the drains)",
        unit="ms",
        ours=statistics.median(ms for sweeps in parking.values() for ms in sweeps),
        baseline=statistics.median(idle),
        baseline_name="nothing to park",
        samples={**parking, NONE: idle},
        extra=extra,
    )
