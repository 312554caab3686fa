"""Property tests of the claim: every store's real claim against the plan, on random outboxes.

For each generated outbox (transactions of mixed sizes, ordering keys shared across
transactions, rows published, in flight under another relay's live or lapsed claim, in backoff,
due for a retry, dead, not yet due, parked behind another row or until due; both order modes;
several batch sizes), the outbox is written to the store's database and one claim runs through
the store (``SqlStore.claim``, PostgreSQL's one-statement claim included). The test compares:

* what the claim took (in order) and parked (and behind which row) with a model: the same
  windows read in memory by a plain-Python reading of the predicates
  (:class:`Model`), decided by :func:`sqla_outbox.plan.claim_windows`;
* what it took with the rule itself, checked directly on the outbox as written: every row taken
  was claimable, and every holding row before it in its transaction and its key is published
  or taken before it (:func:`assert_the_rule_holds`). This check does not use the plan.

Hypothesis shrinks any mismatch to a minimal outbox. ``SQLA_OUTBOX_CLAIM_EXAMPLES`` sets the
number of outboxes per store (default 2,000).
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, insert, select

import sqla_outbox as outbox
from sqla_outbox import plan, retries
from sqla_outbox.liveness import Liveness
from sqla_outbox.stores import PostgresStore, SqlStore, open_store, relay_engine

EXAMPLES = int(os.environ.get("SQLA_OUTBOX_CLAIM_EXAMPLES", "2000"))
LEASE = dt.timedelta(seconds=30)
TOKEN = "relay-under-test:claim"
KEYS = (None, None, "a", "b", "c")
STATES = (
    "free",
    "free",
    "free",
    "published",
    "in_flight",
    "lapsed",
    "backoff",
    "brief_backoff",
    "retry_due",
    "dead",
    "not_due",
    "parked",
    "parked_until_due",
)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
Row = outbox.OutboxRow.__table__


@dataclass(frozen=True)
class Spec:
    """One row of a generated outbox, in claim order."""

    id: uuid.UUID
    transaction: int
    key: str | None
    state: str
    behind: uuid.UUID | None = None
    """A parked row's ``parked_behind``."""
    claimed_by: str | None = None


@dataclass(frozen=True)
class Case:
    rows: tuple[Spec, ...]
    order: str
    batch: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A random outbox: up to eight transactions of one to four rows."""
    transactions = draw(
        st.lists(
            st.lists(
                st.tuples(st.sampled_from(KEYS), st.sampled_from(STATES)), min_size=1, max_size=4
            ),
            max_size=8,
        )
    )
    rows: list[Spec] = []
    for number, transaction in enumerate(transactions):
        for key, state in transaction:
            row_id = uuid.UUID(int=len(rows) + 1)
            behind = None
            if state == "parked" and rows:
                pick = draw(st.integers(min_value=-1, max_value=len(rows) - 1))
                behind = None if pick < 0 else rows[pick].id
            rows.append(Spec(row_id, number, key, state, behind))
    return Case(tuple(rows), draw(st.sampled_from(("key", "strict"))), draw(st.integers(1, 5)))


def values(spec: Spec, now: dt.datetime) -> dict[str, Any]:
    """The row ``spec`` stands for, as the table's columns."""
    hour = dt.timedelta(hours=1)
    row: dict[str, Any] = {
        "id": spec.id,
        "job": "job",
        "queue": "default",
        "input": {"n": spec.id.int},
        "idempotency_key": str(spec.id),
        "max_attempts": 3,
        "run_at": now - hour,
        "staged_at": T0 + dt.timedelta(seconds=spec.transaction),
        "ordering_key": spec.key,
        "claimed_by": None,
        "claimed_at": None,
        "published_at": None,
        "attempts": 0,
        "retry_at": None,
        "dead_at": None,
        "parked": False,
        "parked_behind": None,
        "wake_at": None,
    }
    state = spec.state
    if state == "published":
        row.update(published_at=now - hour)
    elif state == "in_flight":
        row.update(claimed_by="other:live", claimed_at=now - dt.timedelta(seconds=5))
    elif state == "lapsed":
        row.update(claimed_by="other:lapsed", claimed_at=now - hour)
    elif state == "backoff":
        row.update(attempts=1, retry_at=now + hour)
    elif state == "brief_backoff":
        # Ends sooner than PARK_AFTER (1 s), so the claim does not count it stuck, and as late
        # as that allows: the case is written and claimed before it ends, even on a loaded
        # machine (at 0.5 s, four test processes on two cores saw it end first).
        row.update(attempts=1, retry_at=now + dt.timedelta(seconds=0.95))
    elif state == "retry_due":
        row.update(attempts=1, retry_at=now - hour)
    elif state == "dead":
        row.update(attempts=3, dead_at=now - hour)
    elif state == "not_due":
        row.update(run_at=now + hour)
    elif state == "parked":
        row.update(parked=True, parked_behind=spec.behind)
    elif state == "parked_until_due":
        row.update(parked=True, run_at=now + hour, wake_at=now + hour)
    return row


class Model:
    """The outbox in memory, read as the window and holders statements read it."""

    def __init__(self, rows: Sequence[Spec], order: str) -> None:
        self.rows = {spec.id: spec for spec in rows}
        self.order = order

    @staticmethod
    def position(spec: Spec) -> plan.Position:
        return (T0 + dt.timedelta(seconds=spec.transaction), spec.id)

    @staticmethod
    def holding(spec: Spec) -> bool:
        return spec.state not in ("published", "not_due", "parked_until_due")

    @staticmethod
    def stuck(spec: Spec) -> bool:
        """Stuck for a while (:data:`sqla_outbox.plan.PARK_AFTER`)."""
        return spec.state in ("backoff", "dead")

    def claimable(self, spec: Spec) -> bool:
        return spec.claimed_by is None and spec.state in ("free", "lapsed", "retry_due")

    def related(self, spec: Spec, other: Spec, same: str) -> bool:
        if same == "transaction":
            return other.transaction == spec.transaction
        return spec.key is not None and other.key == spec.key

    def first_holding(self, spec: Spec, same: str, *, after: bool) -> uuid.UUID | None:
        """The group's head, or ``spec``'s successor in it (:class:`sqla_outbox.plan.Links`)."""
        found = [
            other
            for other in self.rows.values()
            if self.holding(other)
            and other.claimed_by != TOKEN
            and self.related(spec, other, same)
            and (not after or self.position(other) > self.position(spec))
        ]
        return min(found, key=self.position).id if found else None

    def read(self, after: plan.Position | None, size: int) -> list[plan.Links]:
        ordered = sorted(self.rows.values(), key=self.position)
        bound = None
        if self.order == "strict":
            failing = [
                s
                for s in ordered
                if self.holding(s) and s.state in ("backoff", "brief_backoff", "retry_due", "dead")
            ]
            bound = self.position(failing[0]) if failing else None
        chosen = [
            spec
            for spec in ordered
            if self.claimable(spec)
            and (after is None or self.position(spec) > after)
            and (bound is None or self.position(spec) <= bound)
        ][:size]
        return [
            plan.Links(
                spec.id,
                self.position(spec)[0],
                spec.key,
                self.first_holding(spec, "transaction", after=False),
                self.first_holding(spec, "key", after=False),
                self.first_holding(spec, "transaction", after=True),
                self.first_holding(spec, "key", after=True),
            )
            for spec in chosen
        ]

    def holders_of(self, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, plan.Holder]:
        holders = {}
        for row_id in ids:
            spec = self.rows[row_id]
            behind = self.rows.get(spec.behind) if spec.behind else None
            holders[row_id] = plan.Holder(
                row_id,
                published=spec.state == "published",
                stuck=self.stuck(spec),
                parked=spec.state in ("parked", "parked_until_due"),
                parked_behind=spec.behind,
                stale=spec.state == "parked" and (behind is None or behind.state == "published"),
                behind_stuck=spec.state == "parked" and behind is not None and self.stuck(behind),
            )
        return holders

    def claim(self, batch: int, start: plan.Position | None = None) -> list[uuid.UUID]:
        """What one ``SqlStore.claim`` does: claims while each takes nothing but parks or
        unparks rows; the first window after ``start`` (None: from the front). A row is parked
        only behind a row still unpublished (the store reads it again before parking)."""

        def read(after: plan.Position | None, size: int) -> list[plan.Links]:
            return self.read(after or start, size)

        for _ in range(4):
            _candidates, decided = plan.claim_windows(read, self.holders_of, limit=batch)
            for row_id in decided.take:
                self.rows[row_id] = replace(self.rows[row_id], claimed_by=TOKEN)
            moved = False
            for row_id, behind in decided.park.items():
                if self.rows[behind].state != "published":
                    self.rows[row_id] = replace(self.rows[row_id], state="parked", behind=behind)
                    moved = True
            for row_id in decided.unpark:
                self.rows[row_id] = replace(self.rows[row_id], state="free", behind=None)
                moved = True
            if decided.take or not moved:
                return decided.take
        return []

    def parked(self) -> dict[uuid.UUID, tuple[bool, uuid.UUID | None]]:
        """Every row's ``parked`` and ``parked_behind``."""
        return {
            spec.id: (
                spec.state in ("parked", "parked_until_due"),
                spec.behind if spec.state == "parked" else None,
            )
            for spec in self.rows.values()
        }


def assert_the_rule_holds(rows: Sequence[Spec], taken: Sequence[uuid.UUID]) -> None:
    """Each row taken was claimable (or parked behind nothing that holds it), and every holding
    row before it in its transaction and key is published or taken before it (the rule of
    :mod:`sqla_outbox.plan`, read directly)."""
    model = Model(rows, "key")
    place = {row_id: index for index, row_id in enumerate(taken)}
    for row_id in taken:
        spec = model.rows[row_id]
        # A row parked behind nothing that holds it (a published row, or none) may be unparked
        # by the claim that meets it and taken.
        behind = model.rows.get(spec.behind) if spec.behind else None
        stale = spec.state == "parked" and (behind is None or behind.state == "published")
        assert model.claimable(spec) or stale, f"took {spec}, which no claim may take"
        for other in rows:
            related = other.transaction == spec.transaction or (
                spec.key is not None and other.key == spec.key
            )
            if related and model.holding(other) and model.position(other) < model.position(spec):
                assert place.get(other.id, len(taken)) < place[row_id], (
                    f"took {spec} ahead of {other}"
                )


def record_fast_starts(store: PostgresStore, starts: list[plan.Position]) -> None:
    """Record in ``starts`` where each of ``store``'s one-statement claims that took rows
    started."""
    once = store._claim_fast_once

    def recorded(token: str, carried: Any, done: str) -> Any:
        after = store._after
        claimed, skip_to = once(token, carried, done)
        if claimed.messages:
            starts.append(after)
        return claimed, skip_to

    store._claim_fast_once = recorded  # type: ignore[method-assign]


def store_for(
    engine: Engine, stores: dict[tuple[str, int], SqlStore], order: str, batch: int
) -> SqlStore:
    """A store per order and batch size, built on first use (built once: a store compiles its
    statements when it first sends them)."""
    store = stores.get((order, batch))
    if store is None:
        store = stores[order, batch] = open_store(
            engine,
            relay_id="relay-under-test",
            order=order,
            batch_size=batch,
            claim_lease=LEASE,
            retry=retries.resolve_retry_policy(3, 1.0, 60.0),
            liveness=Liveness(),
        )
    return store


@pytest.mark.slow
def test_every_store_claims_what_the_plan_takes_and_keeps_the_rule(store_engine: Engine) -> None:
    """On thousands of random outboxes, each store's claim takes (in order) and parks (behind
    the same rows) exactly what the plan decides over the same windows, and what it takes
    keeps the ordering rule read directly on the outbox."""
    engine = relay_engine(store_engine)
    stores: dict[tuple[str, int], SqlStore] = {}
    starts: list[plan.Position] = []

    def store_for_case(order: str, batch: int) -> SqlStore:
        known = (order, batch) in stores
        store = store_for(engine, stores, order, batch)
        if not known and isinstance(store, PostgresStore):
            record_fast_starts(store, starts)
        return store

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(case=cases())
    def claim_matches_the_model(case: Case) -> None:
        now = dt.datetime.now(dt.timezone.utc)
        with engine.begin() as conn:
            conn.execute(delete(Row))
            if case.rows:
                conn.execute(insert(Row), [values(spec, now) for spec in case.rows])
        store = store_for_case(case.order, case.batch)
        store.start_over()
        starts.clear()
        try:
            claimed = store.claim(TOKEN, None)
        finally:
            store.drop_connection()
        taken = [message.id for message in claimed.messages]
        with engine.connect() as conn:
            after = {
                row.id: row
                for row in conn.execute(
                    select(Row.c.id, Row.c.claimed_by, Row.c.parked, Row.c.parked_behind)
                )
            }
        model = Model(case.rows, case.order)
        # PostgreSQL's one-statement claim may have gone past a transaction in flight: it takes
        # what the plan takes over the windows from there.
        start = starts[-1] if starts and starts[-1] != plan.FRONT else None
        assert taken == model.claim(case.batch, start)
        assert {i for i, row in after.items() if row.claimed_by == TOKEN} == set(taken)
        assert {i: (bool(row.parked), row.parked_behind) for i, row in after.items()} == (
            model.parked()
        )
        assert_the_rule_holds(case.rows, taken)

    claim_matches_the_model()
