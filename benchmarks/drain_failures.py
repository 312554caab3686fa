"""Workload 9: a relay draining a backlog in which 2% of the messages fail once.

The promise: one bad message must never stop the world. A failed publish is charged to its row
alone (a retry backoff, later a dead letter); only the later rows of its transaction and
ordering key wait for it (handed back and parked); everything else flows. This workload prices
that machinery against the same relay on the same rows with nothing failing.

Both arms restore the drain snapshot of :mod:`benchmarks.drain` (``drain_rows`` rows committed
through ``outbox.enqueue``, ten per transaction; restored, vacuumed, analysed and checkpointed
before every run, untimed) and run the same relay, interleaved per round:

``Relay(engine, publisher, batch_size=100, relay_id="ours", poll_interval=0.01,
retry_base=0.05, retry_max=0.05)`` running its own loop (``start()``, LISTEN included) until
every message has been published successfully once; rows/s from ``start()`` until that last
success (``stop()`` is untimed). The publisher does nothing but record successes (per id, so
duplicates are counted) and, in the failing arm, raise on the **first** attempt of a fixed 2% of
the ids, chosen once from the snapshot (``ORDER BY md5(id::text)``, so spread through the
backlog and at every position of their transactions); their second attempt succeeds.

* **ours, 2% fail once**: :data:`FAILING` of the rows fail once each (1,000 of 50,000).
* **ours, no failures** (the baseline): the same relay and publisher with an empty failing set.
* **raw SQL, 2% fail once** and **raw SQL, no failures** (informative, the floor): a
  hand-written relay that isolates the same failures the cheapest way, with none of the
  library's machinery (:mod:`benchmarks.raw_failures`), same snapshot, publisher and failing
  ids. Its own ratio is what isolating failures costs any relay here; ours against it, both
  failing, is what the library adds.
* **raw SQL that parks, 2% fail once** and **raw SQL that parks, no failures** (informative,
  the bounded floor): the same loop with the one thing more the library promises of a claim,
  that it stay bounded however many rows failures hold back (workload 8): what a failure holds
  back is parked and unparked by its holder's mark, and each pass's write-back rides on the next
  claim, one statement a pass, as in the library's relay; nothing else is added (no ordering
  keys, no dead letters, no other relays). Its own ratio is what isolating failures costs a
  relay built like ours; ours against it, both failing, is what the library adds beyond that.
* **raw SQL that keeps failed rows claimed** (informative, failing and clean): a floor for a
  design the library does not have. The bounded floor's loop, except that a failed row and the
  rows of its transaction after it in the claim are neither handed back nor parked: they stay
  claimed (charged, with the same backoff) in the relay, which publishes them in a later pass
  once the backoff has passed, so they are never claimed twice and nothing is unparked. Its
  ratio says what that design could reach here; ours against it, both failing, what the
  library's relay would still add.
* **raw SQL that parks, two statements a pass** (informative, failing and clean): the bounded
  floor with each write-back a statement of its own after the pass. Its clean drain pays a round
  trip more per pass, its failing drain about the same as the bounded floor's: its ratio shows
  how much of any relay's ratio is the speed of its own clean drain.

* **ours, 2% fail once, write-back in steps** (informative): the same relay with PostgreSQL's
  one-statement write-back turned off (:class:`benchmarks.variants.WriteInSteps`): a failed
  pass's mark, charge and releases as statements of one transaction, as the other stores write
  them. Against ``ours, 2% fail once``: what the one-statement write-back buys.

Why ``retry_base = retry_max = 0.05`` s: a failed row is not claimed again before its backoff
ends (1 s by default, doubling). With the defaults the failing arm would mostly measure the
configured wait of the last failures, not the work of isolating them. A 50 ms backoff makes a
retried row due again within a few passes, so the ratio prices the isolation machinery itself:
the failed publishes, the write-back of every pass that had one (mark, charge and park, riding on
the next claim as a mark alone does), the parked rows skipped and then unparked by their
holder's mark, and the passes the retries add. The row versions each arm wrote are reported
too: the failing arm's extra writes (charges, parking and unparking, the retried rows' second
claim and mark) are work no implementation of the same isolation avoids, and bound the ratio.
The poll interval is small for the same reason: between the last claims the relay may find
nothing due and wait for the backoff of the last failed rows, not for a poll.

The relay logs every failure (``relay.publish_failed``, a warning); a counting handler on the
``sqla_outbox`` logger receives them during this workload (instead of stderr), and its count is
checked against the publisher's. The number of passes is read from the table after each run:
every published row keeps the fence token of the claim that published it, so the distinct
``claimed_by`` values of the published rows are the passes that published something. The JSON
also has, per round, the seconds until 99% of the rows were out: the rest is the retries' tail.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqla_outbox as outbox
from benchmarks.drain import BENCH_RELAY_ID, RELAYS_TIMEOUT, TWO_RELAYS_BATCH, _prepare
from benchmarks.harness import (
    Context,
    Result,
    Target,
    compare,
    fresh_pool,
    interleave,
    restore_outbox,
)
from benchmarks.raw_failures import drain_raw_failing
from benchmarks.variants import WriteInSteps

__all__ = ["FAILING", "POLL_INTERVAL", "RETRY", "run"]

FAILING = 0.02
"""The share of the messages whose first publish fails."""
RETRY = 0.05
"""Seconds, ``retry_base`` and ``retry_max`` of the relay (see the module docs)."""
POLL_INTERVAL = 0.01
BATCH = TWO_RELAYS_BATCH  # the library's default batch size
TARGET = 0.8
MOST = 99
"""Percent of the rows after which the time is noted too: what is left is the retries' tail."""

_PER_ROUND = (
    "refused",
    "charged",
    "passes",
    "row_updates",
    "unpublished",
    "seconds",
    "seconds_to_99pct",
)
"""The :class:`_Round` fields the JSON keeps per round and arm."""

FAILS = "ours, 2% fail once"
CLEAN = "ours, no failures"
STEPS = "ours, 2% fail once, write-back in steps"
RAW_FAILS = "raw SQL, 2% fail once"
RAW_CLEAN = "raw SQL, no failures"
RIDING_FAILS = "raw SQL that parks, 2% fail once"
RIDING_CLEAN = "raw SQL that parks, no failures"
TWO_FAILS = "raw SQL that parks, two statements a pass, 2% fail once"
TWO_CLEAN = "raw SQL that parks, two statements a pass, no failures"
KEEP_FAILS = "raw SQL that keeps failed rows claimed, 2% fail once"
KEEP_CLEAN = "raw SQL that keeps failed rows claimed, no failures"


class _RefusedError(Exception):
    """What the failing publisher raises on a message's first attempt."""


@dataclass
class _Publisher:
    """Counts every success (and the distinct ids, as integers); refuses the first attempt of
    each id in ``failing``.

    Integers, not the ``UUID`` objects: those are tracked by Python's cyclic garbage collector,
    and a harness that keeps every round's ids makes each full collection in the relay's process
    slower round after round, a cost charged mostly to the failing arm, whose exceptions and log
    records set off twice the collections.
    """

    total: int
    failing: frozenset[uuid.UUID]
    published: int = 0
    refused: set[uuid.UUID] = field(default_factory=set)
    distinct: set[int] = field(default_factory=set)
    everything: threading.Event = field(default_factory=threading.Event)
    most_at: float = 0.0
    """``perf_counter()`` when 99% of the rows had been published."""

    def __call__(self, message: outbox.OutboxMessage) -> None:
        self.publish_id(message.id)

    def done(self) -> bool:
        """Whether every message has been published (at least once)."""
        return self.everything.is_set()

    def publish_id(self, message_id: uuid.UUID) -> None:
        """Publish the message ``message_id`` (or refuse its first attempt, if failing)."""
        if message_id in self.failing and message_id not in self.refused:
            self.refused.add(message_id)
            raise _RefusedError("bench: refused once")
        self.published += 1
        self.distinct.add(message_id.int)
        if len(self.distinct) == MOST * self.total // 100:
            self.most_at = time.perf_counter()
        if len(self.distinct) >= self.total:
            self.everything.set()


class _Events(logging.Handler):
    """Counts the relay's log events by name."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "outbox_event", None)
        if event is not None:
            self.counts[event] = self.counts.get(event, 0) + 1


@contextmanager
def _counted_events() -> Iterator[_Events]:
    """Route the ``sqla_outbox`` logger to a counting handler (and nowhere else) meanwhile."""
    logger = logging.getLogger("sqla_outbox")
    handler = _Events()
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _failing_ids(ctx: Context) -> frozenset[uuid.UUID]:
    """A fixed :data:`FAILING` share of the snapshot's ids, spread through the backlog."""
    count = round(ctx.scale.drain_rows * FAILING)
    with ctx.raw() as conn:
        rows = conn.execute(
            "SELECT id FROM outbox_template ORDER BY md5(id::text) LIMIT %s", (count,)
        ).fetchall()
    return frozenset(row[0] for row in rows)


@dataclass
class _Round:
    """What one run of one arm did, beyond its rate."""

    published: int
    """Successful publishes, duplicates included."""
    distinct: int
    refused: int
    charged: int
    passes: int
    row_updates: int
    """Row versions the run wrote (``n_tup_upd`` of the outbox): what the database had to do."""
    unpublished: int
    seconds: float
    seconds_to_99pct: float


def _row_updates(ctx: Context) -> int:
    """The outbox's ``n_tup_upd`` once every session that wrote has reported it.

    A backend reports its counts when it ends (or idles for a while): the caller closes the
    relay's pool first, and the count is read until it stops moving (untimed, bounded).
    """
    last = -1
    deadline = time.monotonic() + 5.0
    with ctx.raw() as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'outbox'"
            ).fetchone()
            count = int(row[0]) if row else 0
            if count == last:
                return count
            last = count
            time.sleep(0.05)
    return last


def _run_relay(
    ctx: Context,
    failing: frozenset[uuid.UUID],
    events: _Events,
    relay_type: type[outbox.Relay] = outbox.Relay,
) -> _Round:
    """One relay (a ``relay_type``) on ``start()`` until every row was published once;
    ``stop()`` untimed."""
    restore_outbox(ctx)
    total = ctx.scale.drain_rows
    publisher = _Publisher(total, failing)
    charged_before = events.counts.get("relay.publish_failed", 0)
    updates_before = _row_updates(ctx)
    fresh_pool(ctx.engine, connections=2)  # the claim connection and the LISTEN one
    relay = relay_type(
        ctx.engine,
        publisher,
        batch_size=BATCH,
        relay_id=BENCH_RELAY_ID,
        poll_interval=POLL_INTERVAL,
        retry_base=RETRY,
        retry_max=RETRY,
    )
    start = time.perf_counter()
    relay.start()
    publisher.everything.wait(RELAYS_TIMEOUT)
    elapsed = time.perf_counter() - start
    relay.stop()
    ctx.engine.dispose()  # its sessions report their row counts as they end
    row_updates = _row_updates(ctx) - updates_before
    with ctx.raw() as conn:
        passes, unpublished = conn.execute(
            "SELECT count(DISTINCT claimed_by) FILTER (WHERE published_at IS NOT NULL), "
            "count(*) FILTER (WHERE published_at IS NULL) FROM outbox"
        ).fetchone()  # type: ignore[misc]
    return _Round(
        published=publisher.published,
        distinct=len(publisher.distinct),
        refused=len(publisher.refused),
        charged=events.counts.get("relay.publish_failed", 0) - charged_before,
        passes=passes,
        row_updates=row_updates,
        unpublished=unpublished,
        seconds=elapsed,
        seconds_to_99pct=publisher.most_at - start,
    )


def run(ctx: Context) -> list[Result]:
    """2% of the messages fail once against none failing: drain rows/s, duplicates, passes."""
    _prepare(ctx)
    failing = _failing_ids(ctx)
    total = ctx.scale.drain_rows
    ctx.log(
        f"drain with {len(failing):,} of {total:,} messages failing once vs none "
        f"(b={BATCH}, start()/stop(), retry {RETRY} s), interleaved"
    )
    rounds: dict[str, list[_Round]] = {FAILS: [], CLEAN: [], STEPS: []}

    def arm(
        name: str,
        ids: frozenset[uuid.UUID],
        events: _Events,
        relay_type: type[outbox.Relay] = outbox.Relay,
    ) -> Callable[[], float]:
        def run_arm() -> float:
            done = _run_relay(ctx, ids, events, relay_type)
            rounds[name].append(done)
            return done.distinct / done.seconds

        return run_arm

    raw_rounds: list[_Publisher] = []

    def raw_arm(ids: frozenset[uuid.UUID], loop: str = "probing") -> Callable[[], float]:
        def run_arm() -> float:
            restore_outbox(ctx)
            publisher = _Publisher(total, ids)
            seconds = drain_raw_failing(ctx, publisher, BATCH, RETRY, loop=loop)
            raw_rounds.append(publisher)
            return len(publisher.distinct) / seconds

        return run_arm

    with _counted_events() as events:
        samples = interleave(
            {
                FAILS: arm(FAILS, failing, events),
                CLEAN: arm(CLEAN, frozenset(), events),
                STEPS: arm(STEPS, failing, events, WriteInSteps),
                RAW_FAILS: raw_arm(failing),
                RAW_CLEAN: raw_arm(frozenset()),
                RIDING_FAILS: raw_arm(failing, "riding"),
                RIDING_CLEAN: raw_arm(frozenset(), "riding"),
                TWO_FAILS: raw_arm(failing, "parking"),
                TWO_CLEAN: raw_arm(frozenset(), "parking"),
                KEEP_FAILS: raw_arm(failing, "keeping"),
                KEEP_CLEAN: raw_arm(frozenset(), "keeping"),
            },
            ctx.scale.drain_rounds,
        )
    every = [done for name in rounds for done in rounds[name]]
    counted = [(done.published, done.distinct) for done in every]
    counted += [(raw.published, len(raw.distinct)) for raw in raw_rounds]
    duplicates = sum(published - distinct for published, distinct in counted)
    missing = sum(total - distinct for _, distinct in counted)
    per_round: dict[str, Any] = {
        key: {name: [getattr(done, key) for done in rounds[name]] for name in rounds}
        for key in _PER_ROUND
    }

    def per_arm(what: str, key: str) -> Result:
        """The median of a per-round count, failing arm against clean arm."""
        return Result(
            name=f"drain, 2% fail once: {what} vs no failures",
            unit="",
            ours=float(statistics.median(per_round[key][FAILS])),
            baseline=float(statistics.median(per_round[key][CLEAN])),
            baseline_name="no failures",
            samples={name: [float(n) for n in per_round[key][name]] for name in rounds},
        )

    return [
        compare(
            f"drain, 2% fail once vs no failures (b={BATCH}, start/stop)",
            "rows/s",
            samples,
            FAILS,
            CLEAN,
            Target("ratio", ">=", TARGET),
            failing_ids=len(failing),
            retry_seconds=RETRY,
            **per_round,
        ),
        compare(
            "drain, 2% fail once: write-back in steps vs ours (what the one-statement "
            "write-back buys)",
            "rows/s",
            samples,
            STEPS,
            FAILS,
        ),
        # The floor: the same failures isolated by a hand-written relay with none of the
        # library's machinery (benchmarks.raw_failures), failing against clean, and ours
        # against it when both fail.
        compare(
            "drain, 2% fail once: raw SQL, failing vs clean (the floor)",
            "rows/s",
            samples,
            RAW_FAILS,
            RAW_CLEAN,
        ),
        compare(
            "drain, 2% fail once: ours vs raw SQL, both failing",
            "rows/s",
            samples,
            FAILS,
            RAW_FAILS,
        ),
        # The bounded floor: the same loop parking what failures hold back (workload 8's
        # promise) with each write-back riding on the next claim, failing against clean, and
        # ours against it when both fail; then the same with two statements a pass.
        compare(
            "drain, 2% fail once: raw SQL that parks, failing vs clean (the bounded floor)",
            "rows/s",
            samples,
            RIDING_FAILS,
            RIDING_CLEAN,
        ),
        compare(
            "drain, 2% fail once: ours vs raw SQL that parks, both failing",
            "rows/s",
            samples,
            FAILS,
            RIDING_FAILS,
        ),
        compare(
            "drain, 2% fail once: raw SQL that parks, two statements a pass, failing vs clean",
            "rows/s",
            samples,
            TWO_FAILS,
            TWO_CLEAN,
        ),
        # A floor for another design: the failed row and what it holds back in its claim stay
        # claimed in the relay through the backoff (nothing handed back, parked or claimed
        # again), then are published by a later pass.
        compare(
            "drain, 2% fail once: raw SQL that keeps failed rows claimed, failing vs clean",
            "rows/s",
            samples,
            KEEP_FAILS,
            KEEP_CLEAN,
        ),
        compare(
            "drain, 2% fail once: ours vs raw SQL that keeps failed rows claimed, both failing",
            "rows/s",
            samples,
            FAILS,
            KEEP_FAILS,
        ),
        Result(
            name="drain, 2% fail once: failed publishes per drain",
            unit="",
            ours=float(statistics.median([done.refused for done in rounds[FAILS]])),
            baseline=float(len(failing)),
            baseline_name="2% of rows",
            extra={"charged_per_round": per_round["charged"][FAILS]},
        ),
        per_arm("passes that published", "passes"),
        # The floor under the ratio: the failing arm's row writes (charges, parking, unparking,
        # the retries' claims and marks) against the clean arm's claims and marks.
        per_arm("row versions written", "row_updates"),
        Result(
            name=f"drain, 2% fail once: duplicates over {len(counted)} drains",
            unit="",
            ours=float(duplicates),
            targets=(Target("ours", "==", 0),),
            extra={"duplicates": duplicates, "missing": missing},
        ),
    ]
