"""What a claim may take, what it must leave, and what it parks: the ordering rule, once.

This module is the specification of the claim and the oracle its tests compare every store
with. It is plain Python over a few facts each store reads from its database; nothing here
touches a database.

The words
---------
Claim order
    ``(staged_at, id)``. Every message of one transaction shares its ``staged_at`` (the
    *transaction* of a row below is its ``staged_at``), and ids grow in enqueue order
    (:mod:`sqla_outbox.ids`).
Holding row
    An unpublished row that is due (``run_at <= now``). Only holding rows hold others back: a
    message scheduled for later joins the order when its time comes.
Group
    A row's transaction, or its ordering key (a row without a key has only its transaction).
Head and successor
    A group's *head* is its first holding row in claim order; a row's *successor* in a group is
    the next holding row of that group after it. The stores read both for every candidate with
    one index probe each, each read forward from the group's start: a handful of index entries
    however many rows the group has after the candidate.
Predecessor
    What a candidate waits for directly in each of its groups. Following the group from its head
    through the successors of the candidates, the *chain* of the group is its head and each
    successor while that is a candidate. A candidate in the chain has the candidate before it
    there as its predecessor (none if it is the head). A candidate not in the chain waits for
    the row where the chain leaves the claim's candidates: the first holding row of its group
    that is not a candidate, which comes before it (:func:`predecessors`).
Candidate
    A row the claim's statement locked: holding, not a dead letter, not parked, past any retry
    backoff, and unclaimed or its claim's lease lapsed; read in claim order, a bounded window
    at a time (:func:`claim_windows`).
Stuck row
    A dead letter, or a row waiting out a retry backoff that ends more than :data:`PARK_AFTER`
    from now: it will not be published for a while. A *parked* row is out of the claim's index,
    waiting for the stuck row it names (``parked_behind``). A row whose backoff ends sooner is
    about to be claimed again: what waits for it is left, like what waits for a claim in flight
    (parking, then unparking everything a hot key holds behind it costs more than the few claims
    that pass it by meanwhile).

The rule
--------
**A row may be published only after every holding row before it in its transaction and in
its ordering key has been published.** A claim's rows are published in claim order, so a
claim may take a candidate exactly when each of its predecessors is taken by the same claim
before it (or it has none). A candidate in its group's chain is preceded in the group by
exactly the chain's earlier members; one outside the chain has a holding row before it that is
not a candidate, its predecessor. So by induction along the chains, a candidate is taken
exactly when every holding row before it of its transaction and of its key is taken before it.
Nothing else is needed for order across relays: a row another relay holds is not a candidate
here, so every row behind it waits; a row a concurrent claim has locked this instant is skipped
by ``SKIP LOCKED`` and is a holding row that is not a candidate, so the same holds.

For each candidate, in claim order, :func:`plan` decides one of three things:

* **take** it, when each predecessor is absent or taken by this claim before it, and the claim
  has fewer than ``limit`` rows (the rows of a claim whose rows count as published, the
  relay's own claim being published as this one is taken (:mod:`sqla_outbox.overlap`), are
  no group's rows to the stores' probes);
* **park** it behind a stuck row, when a predecessor is stuck (it waits for that row), parked
  behind a stuck row (it waits for that one) or a candidate this plan parks. Parked, it leaves the
  claim's index, so later claims find the work past it instead of reading it again; publishing,
  retrying or discarding the stuck row frees it (the mark unparks the rows parked behind the
  rows it publishes, by ``ix_outbox_parked_behind``), and a relay's sweep frees any row whose
  stuck row went another way. Parking is always safe for order: an unparked row that still has
  to wait is parked again by the next claim that meets it;
* **leave** it otherwise: a predecessor is in another claim (live), locked by a claim running at
  this instant, a candidate left, a holding row this claim did not read, or published (or
  gone) since the claim read the links: other rows may stand between it and the candidate, and
  the next claim reads them. It stays where it is; the claim that holds its predecessor is
  about to finish. A predecessor parked behind a
  row that is published or gone waits for nothing any more: the claim unparks it
  (:attr:`ClaimPlan.unpark`), and the next claim takes it and what follows it.

A candidate whose two predecessors differ in kind is parked if either waits for a stuck row: it
must wait for that row anyway. Only the first row of a group the claim does not hold decides
for the candidates after it, as it must be published before any of them.

``order="strict"`` adds one bound, in the read itself: nothing after the first holding row
that has failed a publish (whichever relay retries it) is a candidate, so a failed message
holds back every later one.

Bounded claims
--------------
A claim reads at most :data:`MOST_READ_BATCHES` batches of candidates, in windows that double
(:func:`claim_windows`), with four short index probes per candidate (the head of each of its
groups and its successor in each) and one primary-key read per predecessor outside the
candidates, whatever the outbox holds: how many rows are parked, behind how few keys, or held
by other relays. Parked rows are outside the claim's index, so they cost a claim nothing. A
window whose last candidate is not taken ends inside a transaction that is held: the next
window starts after that transaction (:func:`resume_after`), so a relay finds the work behind a
large transaction another relay is publishing in one more read, not one window per batch of it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "FIRST_ID",
    "FRONT",
    "LAST_ID",
    "MOST_READ_BATCHES",
    "PARK_AFTER",
    "Candidate",
    "ClaimPlan",
    "Holder",
    "Links",
    "Position",
    "claim_windows",
    "plan",
    "predecessors",
    "resume_after",
]

Position = tuple[dt.datetime, uuid.UUID]
"""A row's place in claim order: ``(staged_at, id)``."""

FIRST_ID: Final = uuid.UUID(int=0)
"""The least id."""
LAST_ID: Final = uuid.UUID(int=(1 << 128) - 1)
"""The greatest id: ``(staged_at, LAST_ID)`` is the end of the transaction ``staged_at``."""
FRONT: Final[Position] = (dt.datetime(1000, 1, 1, tzinfo=dt.timezone.utc), FIRST_ID)
"""A position before every row (the earliest instant every database's column takes): a read
from the front of the outbox."""

PARK_AFTER: Final = dt.timedelta(seconds=1)
"""A row waiting out a retry backoff that ends later than this from now is stuck: what waits
for it is parked behind it (see the module docs)."""

MOST_READ_BATCHES: Final = 16
"""The most candidates one claim reads, in batches: past them, a relay waits for the rows that
hold the rest back instead of reading further."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A row a claim locked, with its predecessors (see the module docs and
    :func:`predecessors`)."""

    id: uuid.UUID
    staged_at: dt.datetime
    ordering_key: str | None
    transaction_predecessor: uuid.UUID | None
    key_predecessor: uuid.UUID | None

    @property
    def position(self) -> Position:
        """Its place in claim order."""
        return (self.staged_at, self.id)


@dataclass(frozen=True, slots=True)
class Holder:
    """A predecessor that is not a candidate, as the claim read it."""

    id: uuid.UUID
    published: bool = False
    stuck: bool = False
    """A dead letter, or waiting out a retry backoff."""
    parked: bool = False
    parked_behind: uuid.UUID | None = None
    """The row it waits for, if it is parked behind one."""
    stale: bool = False
    """Parked behind a row that is published or gone (or naming none): it waits for nothing
    any more, and only has to be unparked."""
    behind_stuck: bool = False
    """Parked behind a row that is stuck: what waits for this row waits for that one."""


@dataclass(slots=True)
class ClaimPlan:
    """What a claim does with its candidates: every candidate is in exactly one of these."""

    take: list[uuid.UUID] = field(default_factory=list)
    """In claim order, at most ``limit``."""
    park: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)
    """Candidate -> the row it waits for (``parked_behind``)."""
    leave: list[uuid.UUID] = field(default_factory=list)
    unpark: set[uuid.UUID] = field(default_factory=set)
    """Predecessors (not candidates) parked behind a row that is published or gone: they wait
    for nothing, and what waits for them is left until they are unparked and taken."""


_TAKE: Final = "take"
_LEAVE: Final = "leave"


def plan(
    candidates: Sequence[Candidate], holders: Mapping[uuid.UUID, Holder], *, limit: int
) -> ClaimPlan:
    """Decide each of ``candidates`` (in claim order): take, park or leave (see the module docs).

    ``holders`` has the predecessors that are not candidates (one it lacks is gone since the
    candidates were read).
    """
    verdicts: dict[uuid.UUID, str | uuid.UUID] = {}
    """Candidate -> _TAKE, _LEAVE, or the id of the row it is parked behind."""
    result = ClaimPlan()
    for candidate in candidates:
        verdict: str | uuid.UUID = _TAKE
        for predecessor in (candidate.transaction_predecessor, candidate.key_predecessor):
            if predecessor is None:
                continue
            waits = verdicts.get(predecessor)
            if waits is None:
                holder = holders.get(predecessor)
                waits = _waits_for(holder)
                if holder is not None and holder.stale and waits == _LEAVE:
                    result.unpark.add(predecessor)
            if waits == _TAKE:
                continue
            if waits == _LEAVE:
                verdict = _LEAVE if verdict == _TAKE else verdict
            elif not isinstance(verdict, uuid.UUID):
                verdict = waits  # parked wins over left: the stuck row must go first anyway
        if verdict == _TAKE and len(result.take) >= limit:
            verdict = _LEAVE
        verdicts[candidate.id] = verdict
        if verdict == _TAKE:
            result.take.append(candidate.id)
        elif verdict == _LEAVE:
            result.leave.append(candidate.id)
        else:
            result.park[candidate.id] = verdict  # type: ignore[assignment]
    return result


def _waits_for(holder: Holder | None) -> str | uuid.UUID:
    """What a candidate whose predecessor is ``holder`` (not a candidate) waits for: the row it
    parks behind, or anything else (:data:`_LEAVE`)."""
    if holder is None or holder.published:
        return _LEAVE
    if holder.stuck:
        return holder.id
    if holder.parked and holder.behind_stuck and holder.parked_behind is not None:
        return holder.parked_behind
    return _LEAVE


@dataclass(frozen=True, slots=True)
class Links:
    """A locked row as the stores read it: its place and groups, and per group its head and
    its successor (``None``: it has none)."""

    id: uuid.UUID
    staged_at: dt.datetime
    ordering_key: str | None
    transaction_head: uuid.UUID | None
    key_head: uuid.UUID | None
    transaction_successor: uuid.UUID | None
    key_successor: uuid.UUID | None


def predecessors(window: Sequence[Links]) -> list[Candidate]:
    """``window`` (in claim order) as candidates with their predecessors: each group followed
    from its head through the candidates' successors (see the module docs)."""
    found: dict[uuid.UUID, list[uuid.UUID | None]] = {row.id: [None, None] for row in window}
    groups: dict[tuple[int, object], list[Links]] = {}
    for row in window:
        groups.setdefault((0, row.staged_at), []).append(row)
        if row.ordering_key is not None:
            groups.setdefault((1, row.ordering_key), []).append(row)
    for (which, _group), members in groups.items():
        expected = _head(members[0], which)  # the next row of the group's chain
        previous: uuid.UUID | None = None  # the chain's last candidate
        blocker: uuid.UUID | None = None  # where the chain left the candidates
        for row in members:
            if blocker is None and expected in (row.id, None):
                # In the chain. (None: the read saw no head or successor where the window has a
                # row; the row then waits for the candidate before it, which is as safe.)
                found[row.id][which] = previous
                previous, expected = row.id, _successor(row, which)
                continue
            # `expected` is a holding row of the group after the chain's last candidate and
            # before this one, and no candidate: the chain leaves the window there, and every
            # later candidate of the group waits for it.
            blocker = blocker or expected
            found[row.id][which] = blocker
    return [Candidate(row.id, row.staged_at, row.ordering_key, *found[row.id]) for row in window]


def _head(row: Links, which: int) -> uuid.UUID | None:
    return row.transaction_head if which == 0 else row.key_head


def _successor(row: Links, which: int) -> uuid.UUID | None:
    return row.transaction_successor if which == 0 else row.key_successor


def resume_after(last: Candidate, result: ClaimPlan) -> Position:
    """Where the next window of a claim starts, after one whose last candidate is ``last``.

    A last candidate the claim does not take holds back the rest of its transaction: the next
    window starts after that whole transaction, whatever its size.
    """
    if result.take and result.take[-1] == last.id:
        return last.position
    return (last.staged_at, LAST_ID)


def claim_windows(
    read: Callable[[Position | None, int], Sequence[Links]],
    holders_of: Callable[[set[uuid.UUID]], Mapping[uuid.UUID, Holder]],
    *,
    limit: int,
) -> tuple[list[Candidate], ClaimPlan]:
    """One claim's candidates and its plan, read window by window.

    ``read(after, size)`` locks and returns up to ``size`` candidates after position ``after``
    (``None``: from the first) in claim order, with their links; ``holders_of(ids)`` reads the
    predecessors ``ids`` that are not candidates. The first window is ``limit`` rows; each next
    one, read while the plan takes fewer than ``limit`` rows and the last window came back full,
    is twice the last, until :data:`MOST_READ_BATCHES` batches were read. The predecessors are
    found over every window read so far: a group's chain may run on from one window into the
    next.
    """
    links: list[Links] = []
    holders: dict[uuid.UUID, Holder] = {}
    after: Position | None = None
    size, budget = limit, limit * MOST_READ_BATCHES
    while True:
        window = read(after, size)
        links.extend(window)
        candidates = predecessors(links)
        seen = {row.id for row in links}
        missing = {
            predecessor
            for candidate in candidates
            for predecessor in (candidate.transaction_predecessor, candidate.key_predecessor)
            if predecessor is not None and predecessor not in seen and predecessor not in holders
        }
        if missing:
            holders.update(holders_of(missing))
        result = plan(candidates, holders, limit=limit)
        budget -= size
        if len(result.take) >= limit or len(window) < size or budget <= 0:
            return candidates, result
        after = resume_after(candidates[-1], result)
        size = min(size * 2, budget)
