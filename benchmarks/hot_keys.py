"""Workload 14: a drain over a few hot ordering keys while 2% of the messages fail once.

The soak's shape (``python -m benchmarks.soak``), where delivery stalls most easily: every
message on one of a few hot keys (an account, a tenant), transactions spanning several keys,
and a few publishes failing once. A failed message holds back the later messages of its
transaction and of its key until its retry is published; with :data:`KEYS` keys that is,
transitively, most of what comes after it. What this workload prices is the relay's work around
each failure: handing back and parking what waits, finding it again once the failed row is
published, and claims that stay bounded meanwhile.

The backlog (:data:`ROWS`, or :data:`QUICK_ROWS` with ``--quick``) is committed through
``outbox.enqueue`` in transactions of :data:`PER_TRANSACTION` messages, each message on one of
:data:`KEYS` ordering keys drawn from ``random.Random(`` :data:`SEED` ``)``, and snapshotted
once (``outbox_hot_keys_template``); every run restores it, vacuumed, analysed and
checkpointed, untimed, on a freshly opened pool connection. Both arms run the same relay,
``Relay(engine, publisher, batch_size=100, relay_id="ours", retry_base=0.001,
retry_max=0.001)``, calling ``drain()`` until every message has been published once (a drain
returns when nothing is claimable, which a failed row in its backoff can make true for a
moment: the next ``drain()`` follows at once, or after :data:`RETRY` when the last claimed
nothing). Rows/s from the first ``drain()`` to the last success; interleaved per round:

* **ours, 2% fail once**: the publisher, a no-op otherwise, raises on the first attempt of a
  fixed :data:`FAILING` share of the ids (``ORDER BY md5(id::text)`` over the snapshot);
* **ours, no failures** (the baseline): the same relay and publisher, nothing failing. The only
  difference is the failures, on the same rows.

Why a 1 ms backoff (:data:`RETRY`): a failed row is not claimed again before its backoff ends
(1 s by default, doubling), and with hot keys it holds back most later rows meanwhile, so with
the defaults the failing arm would measure the waits the backoff asks for, one after another,
not the relay. Any positive backoff is accepted (``sqla_outbox.retries``); at 1 ms the row
measures the claims' work around the failures.

Counted over every run of both arms: duplicates (successes beyond the first of an id), missing
messages (never published) and, after a run that finished, rows the table still has
unpublished (published but never marked); the second row is their sum and must be 0. The JSON
has, per round and arm, the seconds, the refused publishes (and the relay's
``relay.publish_failed`` events), the passes that claimed something, the rows they claimed and
the ``drain()`` calls.

A run that has not published everything after :data:`TIMEOUT` seconds (:data:`QUICK_TIMEOUT`
with ``--quick``) is stopped (``relay.stop()`` from a timer), so the suite cannot hang on a
relay that stalls: its rate counts what it published, the row's name says how many runs were
stopped, what they left counts as missing (so the second row misses too), and no further
rounds run.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqla_outbox as outbox
from benchmarks.drain import BENCH_RELAY_ID
from benchmarks.drain_failures import _counted_events, _Events
from benchmarks.harness import Context, Result, Target, compare, fresh_pool, interleave
from benchmarks.raw_keyed import drain_raw_keyed

__all__ = ["FAILING", "KEYS", "PER_TRANSACTION", "QUICK_ROWS", "RETRY", "ROWS", "run"]

ROWS = 20_000
QUICK_ROWS = 4_000
PER_TRANSACTION = 4
KEYS = 16
SEED = 14
FAILING = 0.02
"""The share of the messages whose first publish fails."""
RETRY = 0.001
"""Seconds, the relay's ``retry_base`` and ``retry_max`` (see the module docs)."""
BATCH = 100
TARGET = 0.5
TIMEOUT = 120.0
"""Seconds after which a run is stopped (full size)."""
QUICK_TIMEOUT = 30.0

TEMPLATE = "outbox_hot_keys_template"
_SNAPSHOT = (
    f"DROP TABLE IF EXISTS {TEMPLATE}",
    f"CREATE TABLE {TEMPLATE} AS SELECT * FROM outbox",
)
_RESTORE = (
    "TRUNCATE outbox",
    f"INSERT INTO outbox SELECT * FROM {TEMPLATE}",
    "VACUUM ANALYZE outbox",
    "CHECKPOINT",
)

FAILS = "ours, hot keys, 2% fail once"
CLEAN = "ours, hot keys, no failures"
RAW_FAILS = "raw SQL keeping key order, hot keys, 2% fail once"
RAW_CLEAN = "raw SQL keeping key order, hot keys, no failures"
KEEP_FAILS = "raw SQL retrying in the pass, hot keys, 2% fail once"
KEEP_CLEAN = "raw SQL retrying in the pass, hot keys, no failures"

_PER_ROUND = (
    "seconds",
    "refused",
    "charged",
    "passes",
    "claimed",
    "drains",
    "distinct",
    "unmarked",
)
"""The :class:`_Run` fields the JSON keeps per round and arm."""


class _RefusedError(Exception):
    """What the publisher raises on a failing message's first attempt."""


@dataclass
class _Publisher:
    """A no-op publisher that refuses the first attempt of each id in ``failing``, and counts
    successes and distinct ids (as integers: see ``benchmarks.drain_failures._Publisher``)."""

    failing: frozenset[uuid.UUID]
    total: int
    published: int = 0
    refused: set[uuid.UUID] = field(default_factory=set)
    distinct: set[int] = field(default_factory=set)

    def __call__(self, message: outbox.OutboxMessage) -> None:
        self.publish_id(message.id)

    def publish_id(self, message_id: uuid.UUID) -> None:
        """Publish ``message_id`` (or refuse its first attempt, if failing)."""
        if message_id in self.failing and message_id not in self.refused:
            self.refused.add(message_id)
            raise _RefusedError("bench: refused once")
        self.published += 1
        self.distinct.add(message_id.int)

    def done(self) -> bool:
        """Whether every message has been published (at least once)."""
        return len(self.distinct) >= self.total


@dataclass
class _Passes:
    """Counts the relay's passes that claimed something, and the rows they claimed."""

    passes: int = 0
    claimed: int = 0

    def pass_done(self, report: Any) -> None:
        self.passes += 1
        self.claimed += len(report.claimed)


@dataclass
class _Run:
    """What one run of one arm did."""

    rows: int
    seconds: float
    published: int
    distinct: int
    refused: int
    charged: int
    """The relay's ``relay.publish_failed`` events: the failures it charged."""
    passes: int
    claimed: int
    drains: int
    unmarked: int
    """Rows still unpublished in the outbox after the run (``published_at IS NULL``)."""
    timed_out: bool

    @property
    def rate(self) -> float:
        return self.distinct / self.seconds


def _fill(ctx: Context, rows: int) -> None:
    """Commit the backlog through ``outbox.enqueue`` and snapshot it."""
    ctx.clear_tables()
    keys = random.Random(SEED)
    done = 0
    while done < rows:
        with ctx.sessions() as session:
            for _ in range(min(PER_TRANSACTION, rows - done)):
                key = f"account-{keys.randrange(KEYS)}"
                outbox.enqueue(session, "hot_keys", {"n": done}, ordering_key=key)
                done += 1
            session.commit()
    ctx.sql(*_SNAPSHOT)


def _failing_ids(ctx: Context, rows: int) -> frozenset[uuid.UUID]:
    """A fixed :data:`FAILING` share of the snapshot's ids, spread through the backlog."""
    with ctx.raw() as conn:
        found = conn.execute(
            f"SELECT id FROM {TEMPLATE} ORDER BY md5(id::text) LIMIT %s".encode(),
            (round(rows * FAILING),),
        ).fetchall()
    return frozenset(row[0] for row in found)


def _drain(
    ctx: Context, rows: int, failing: frozenset[uuid.UUID], events: _Events, timeout: float
) -> _Run:
    """Restore, then ``drain()`` until every message was published once or ``timeout``."""
    ctx.sql(*_RESTORE)
    publisher = _Publisher(failing, rows)
    passes = _Passes()
    charged_before = events.counts.get("relay.publish_failed", 0)
    fresh_pool(ctx.engine)
    relay = outbox.Relay(
        ctx.engine,
        publisher,
        batch_size=BATCH,
        relay_id=BENCH_RELAY_ID,
        retry_base=RETRY,
        retry_max=RETRY,
    )
    relay.observe(passes)
    # A drain() in flight at the deadline is stopped from another thread.
    deadline = threading.Timer(timeout, relay.stop)
    drains = 0
    start = time.perf_counter()
    deadline.start()
    try:
        while len(publisher.distinct) < rows and deadline.is_alive():
            result = relay.drain()
            drains += 1
            if not result.claimed:
                time.sleep(RETRY)  # what is left is in its backoff
        elapsed = time.perf_counter() - start
    finally:
        timed_out = not deadline.is_alive()
        deadline.cancel()
        relay.close()
    with ctx.raw() as conn:
        unmarked = conn.execute(b"SELECT count(*) FROM outbox WHERE published_at IS NULL")
        left = unmarked.fetchone()
    return _Run(
        rows=rows,
        seconds=elapsed,
        published=publisher.published,
        distinct=len(publisher.distinct),
        refused=len(publisher.refused),
        charged=events.counts.get("relay.publish_failed", 0) - charged_before,
        passes=passes.passes,
        claimed=passes.claimed,
        drains=drains,
        unmarked=int(left[0]) if left else 0,
        timed_out=timed_out and len(publisher.distinct) < rows,
    )


def run(ctx: Context) -> list[Result]:
    """Hot keys with 2% failing once against the same drain with nothing failing."""
    rows = QUICK_ROWS if ctx.quick else ROWS
    timeout = QUICK_TIMEOUT if ctx.quick else TIMEOUT
    ctx.log(
        f"filling {rows:,} rows through outbox.enqueue, {PER_TRANSACTION} per transaction, "
        f"on {KEYS} ordering keys"
    )
    _fill(ctx, rows)
    failing = _failing_ids(ctx, rows)
    ctx.log(
        f"hot keys: {len(failing):,} of {rows:,} failing once vs none "
        f"(b={BATCH}, drain(), retry {RETRY * 1000:g} ms, at most {timeout:g} s a run)"
    )
    runs: dict[str, list[_Run]] = {FAILS: [], CLEAN: []}
    raw_runs: dict[str, list[_Publisher]] = {
        name: [] for name in (RAW_FAILS, RAW_CLEAN, KEEP_FAILS, KEEP_CLEAN)
    }
    samples: dict[str, list[float]] = {name: [] for name in (FAILS, CLEAN, *raw_runs)}
    with _counted_events() as events:

        def arm(name: str, ids: frozenset[uuid.UUID]) -> Callable[[], float]:
            def run_arm() -> float:
                done = _drain(ctx, rows, ids, events, timeout)
                runs[name].append(done)
                ctx.log(
                    f"  {name}: {done.seconds:.2f} s, {done.distinct:,} published, "
                    f"{done.passes:,} passes{', TIMED OUT' if done.timed_out else ''}"
                )
                return done.rate

            return run_arm

        def raw_arm(
            name: str, ids: frozenset[uuid.UUID], *, retrying: bool = False
        ) -> Callable[[], float]:
            def run_arm() -> float:
                ctx.sql(*_RESTORE)
                publisher = _Publisher(ids, rows)
                seconds = drain_raw_keyed(ctx, publisher, BATCH, RETRY, timeout, retrying=retrying)
                raw_runs[name].append(publisher)
                ctx.log(f"  {name}: {seconds:.2f} s, {len(publisher.distinct):,} published")
                return len(publisher.distinct) / seconds

            return run_arm

        arms = {
            FAILS: arm(FAILS, failing),
            CLEAN: arm(CLEAN, frozenset()),
            RAW_FAILS: raw_arm(RAW_FAILS, failing),
            RAW_CLEAN: raw_arm(RAW_CLEAN, frozenset()),
            KEEP_FAILS: raw_arm(KEEP_FAILS, failing, retrying=True),
            KEEP_CLEAN: raw_arm(KEEP_CLEAN, frozenset(), retrying=True),
        }
        for index in range(ctx.scale.drain_rounds):
            # One round at a time, alternating the order as interleave() does over rounds, so
            # that a run which timed out ends the workload after its round.
            order = arms if index % 2 == 0 else dict(reversed(arms.items()))
            for name, numbers in interleave(order, 1).items():
                samples[name].extend(numbers)
            if any(done.timed_out for done in runs[FAILS] + runs[CLEAN]):
                ctx.log(f"hot keys: a run timed out after {timeout:g} s; no further rounds")
                break
    ctx.sql(f"DROP TABLE {TEMPLATE}")
    ctx.clear_tables()
    every = runs[FAILS] + runs[CLEAN]
    duplicates = sum(done.published - done.distinct for done in every)
    # A run stopped at the timeout counts what it left as missing (as drain.py's two relays
    # do), and so makes this row miss too; the extra fields say which runs were stopped.
    missing = sum(done.rows - done.distinct for done in every)
    stopped = sum(done.rows - done.distinct for done in every if done.timed_out)
    unmarked = sum(done.unmarked for done in every if not done.timed_out)
    timed_out = sum(done.timed_out for done in every)
    per_round: dict[str, Any] = {
        key: {name: [getattr(done, key) for done in runs[name]] for name in runs}
        for key in _PER_ROUND
    }
    suffix = f"; {timed_out} run(s) stopped at {timeout:g} s" if timed_out else ""

    def wrong(*names: str) -> int:
        """Duplicated or missing messages over the runs of the raw arms ``names``."""
        done = [p for name in names for p in raw_runs[name]]
        return sum(p.published - len(p.distinct) + rows - len(p.distinct) for p in done)

    return [
        compare(
            f"drain, {KEYS} hot keys, 2% fail once vs no failures "
            f"(b={BATCH}, retry {RETRY * 1000:g} ms){suffix}",
            "rows/s",
            samples,
            FAILS,
            CLEAN,
            Target("ratio", ">=", TARGET),
            rows=rows,
            failing_ids=len(failing),
            retry_seconds=RETRY,
            timeout_seconds=timeout,
            timed_out_runs=timed_out,
            seconds_median={name: statistics.median(per_round["seconds"][name]) for name in runs},
            **per_round,
        ),
        # The floor: the same drain by the cheapest hand-written relay that keeps transaction
        # and key order with bounded claims (benchmarks.raw_keyed), measured in the same run.
        compare(
            f"drain, {KEYS} hot keys, 2% fail once: raw SQL keeping key order, failing vs clean "
            "(the floor)",
            "rows/s",
            samples,
            RAW_FAILS,
            RAW_CLEAN,
            duplicated_or_missing=wrong(RAW_FAILS, RAW_CLEAN),
        ),
        # A floor for a design the library does not have: a pass keeps its claim through a
        # failure's backoff and retries it (benchmarks.raw_keyed, retrying).
        compare(
            f"drain, {KEYS} hot keys, 2% fail once: raw SQL retrying in the pass, failing vs clean",
            "rows/s",
            samples,
            KEEP_FAILS,
            KEEP_CLEAN,
            duplicated_or_missing=wrong(KEEP_FAILS, KEEP_CLEAN),
        ),
        Result(
            name=f"drain, {KEYS} hot keys: duplicated or missing over {len(every)} drains",
            unit="",
            ours=float(duplicates + missing + unmarked),
            targets=(Target("ours", "==", 0),),
            extra={
                "duplicates": duplicates,
                "missing": missing,
                "missing_in_stopped_runs": stopped,
                "unmarked_after_finished_runs": unmarked,
                "timed_out_runs": timed_out,
            },
        ),
    ]
