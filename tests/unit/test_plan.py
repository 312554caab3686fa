"""The ordering rule as plain Python: :func:`sqla_outbox.plan.plan` and its claim windows."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence

from sqla_outbox.plan import (
    LAST_ID,
    MOST_READ_BATCHES,
    Candidate,
    Holder,
    Links,
    Position,
    claim_windows,
    plan,
    predecessors,
    resume_after,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def ident(n: int) -> uuid.UUID:
    return uuid.UUID(int=n)


def row(
    n: int,
    tx: int,
    key: str | None = None,
    *,
    tx_pred: int | None = None,
    key_pred: int | None = None,
) -> Candidate:
    """Candidate ``n`` of transaction ``tx`` (its ``staged_at``), with predecessors by number."""
    return Candidate(
        ident(n),
        T0 + dt.timedelta(seconds=tx),
        key,
        None if tx_pred is None else ident(tx_pred),
        None if key_pred is None else ident(key_pred),
    )


def test_a_candidate_without_predecessors_is_taken() -> None:
    """Nothing before it in its transaction or key: taken."""
    result = plan([row(1, 1), row(2, 2)], {}, limit=10)
    assert result.take == [ident(1), ident(2)]
    assert not result.park
    assert not result.leave


def test_a_candidate_follows_its_predecessors_taken_in_the_same_claim() -> None:
    """Predecessors taken first by the same claim let it through, in claim order."""
    candidates = [row(1, 1, "k"), row(2, 1, tx_pred=1), row(3, 2, "k", key_pred=1)]
    assert plan(candidates, {}, limit=10).take == [ident(1), ident(2), ident(3)]


def test_a_predecessor_in_another_claim_leaves_the_candidate_and_what_follows_it() -> None:
    """A predecessor another relay holds: the candidate and its followers stay where they are."""
    holders = {ident(1): Holder(ident(1))}
    candidates = [row(2, 1, "k", tx_pred=1), row(3, 2, "k", key_pred=2), row(4, 3)]
    result = plan(candidates, holders, limit=10)
    assert result.take == [ident(4)]
    assert result.leave == [ident(2), ident(3)]
    assert not result.park


def test_a_stuck_predecessor_parks_the_candidate_and_its_followers_behind_it() -> None:
    """A dead letter or a row in backoff: everything waiting for it is parked, naming it."""
    holders = {ident(1): Holder(ident(1), stuck=True)}
    candidates = [row(2, 1, "k", tx_pred=1), row(3, 2, "k", key_pred=2), row(4, 2, tx_pred=3)]
    result = plan(candidates, holders, limit=10)
    assert result.park == {ident(2): ident(1), ident(3): ident(1), ident(4): ident(1)}
    assert not result.take


def test_a_parked_predecessor_passes_on_what_it_waits_for() -> None:
    """Behind a row parked behind a stuck row, a candidate waits for that stuck row; behind one
    parked behind a row that is not stuck (out of its backoff soon, or parked itself), it is
    left; behind one parked behind nothing that holds it, it is left and that row unparked."""
    holders = {
        ident(1): Holder(ident(1), parked=True, parked_behind=ident(9), behind_stuck=True),
        ident(3): Holder(ident(3), parked=True, parked_behind=ident(8)),
        ident(5): Holder(ident(5), parked=True, stale=True),
    }
    candidates = [row(2, 1, tx_pred=1), row(4, 2, tx_pred=3), row(6, 3, tx_pred=5)]
    result = plan(candidates, holders, limit=10)
    assert result.park == {ident(2): ident(9)}
    assert result.leave == [ident(4), ident(6)]
    assert result.unpark == {ident(5)}


def test_parked_wins_over_left() -> None:
    """One predecessor stuck, the other in flight: parked behind the stuck one."""
    holders = {
        ident(1): Holder(ident(1)),
        ident(2): Holder(ident(2), stuck=True),
    }
    result = plan([row(3, 1, "k", tx_pred=1, key_pred=2)], holders, limit=10)
    assert result.park == {ident(3): ident(2)}


def test_a_predecessor_published_or_gone_since_the_read_leaves_the_candidate() -> None:
    """The row a candidate waits for was published (or is gone) since the claim read the
    links: rows may stand between it and the candidate that the claim did not read. Left, for
    the next claim to read them."""
    holders = {ident(1): Holder(ident(1), published=True)}
    result = plan([row(3, 1, tx_pred=1), row(4, 2, tx_pred=99), row(5, 3)], holders, limit=10)
    assert result.take == [ident(5)]
    assert result.leave == [ident(3), ident(4)]


def test_the_limit_leaves_the_rest_and_what_waits_for_it() -> None:
    """Past ``limit`` rows, takeable candidates are left, and so is what follows them."""
    candidates = [row(1, 1), row(2, 1, tx_pred=1), row(3, 1, tx_pred=2), row(4, 2)]
    result = plan(candidates, {}, limit=2)
    assert result.take == [ident(1), ident(2)]
    assert result.leave == [ident(3), ident(4)]


def test_resume_after_skips_a_held_transaction() -> None:
    """A window whose last row is not taken resumes after its whole transaction."""
    last = row(7, 3)
    assert resume_after(last, plan([last], {}, limit=1)) == last.position
    waiting = row(7, 3, tx_pred=6)
    held = plan([waiting], {ident(6): Holder(ident(6))}, limit=1)
    assert resume_after(last, held) == (last.staged_at, LAST_ID)


def link(
    n: int,
    tx: int,
    key: str | None = None,
    *,
    heads: tuple[int | None, int | None] = (None, None),
    successors: tuple[int | None, int | None] = (None, None),
) -> Links:
    """Row ``n`` of transaction ``tx`` as a store reads it: heads and successors by number."""

    def maybe(value: int | None) -> uuid.UUID | None:
        return None if value is None else ident(value)

    return Links(
        ident(n),
        T0 + dt.timedelta(seconds=tx),
        key,
        maybe(heads[0]),
        maybe(heads[1]),
        maybe(successors[0]),
        maybe(successors[1]),
    )


def test_predecessors_follow_each_group_from_its_head_through_the_candidates() -> None:
    """Transaction 1 is rows 1, 2, 3 and all are candidates: a chain, each waits for the one
    before. Key K is rows 1, 5, 6, 8, and row 7 (K too) is not a candidate: 5 waits for 1, 6 for
    5, and 8, past where the chain leaves the window at 7, waits for 7."""
    window = [
        link(1, 1, "K", heads=(1, 1), successors=(2, 5)),
        link(2, 1, heads=(1, None), successors=(3, None)),
        link(3, 1, heads=(1, None)),
        link(5, 2, "K", heads=(5, 1), successors=(None, 6)),
        link(6, 3, "K", heads=(6, 1), successors=(None, 7)),
        link(8, 4, "K", heads=(8, 1)),
    ]
    found = {c.id.int: (c.transaction_predecessor, c.key_predecessor) for c in predecessors(window)}
    assert found == {
        1: (None, None),
        2: (ident(1), None),
        3: (ident(2), None),
        5: (None, ident(1)),
        6: (None, ident(5)),
        8: (None, ident(7)),
    }


def test_a_group_whose_head_is_no_candidate_waits_for_its_head() -> None:
    """Key K's head (row 1) is in another claim: every candidate of K waits for it."""
    window = [link(2, 1, "K", heads=(2, 1), successors=(None, 3)), link(3, 2, "K", heads=(3, 1))]
    assert [c.key_predecessor for c in predecessors(window)] == [ident(1), ident(1)]


class Outbox:
    """Candidates in claim order, read window by window as a store reads them."""

    def __init__(self, candidates: Sequence[Links], holders: Mapping[uuid.UUID, Holder]):
        self.candidates = list(candidates)
        self.holders = dict(holders)
        self.reads: list[tuple[Position | None, int]] = []

    def read(self, after: Position | None, size: int) -> list[Links]:
        self.reads.append((after, size))
        rows = [c for c in self.candidates if after is None or (c.staged_at, c.id) > after]
        return rows[:size]

    def holders_of(self, ids: set[uuid.UUID]) -> dict[uuid.UUID, Holder]:
        return {i: self.holders[i] for i in ids if i in self.holders}


def test_a_claim_reads_past_a_large_transaction_held_by_another_claim() -> None:
    """Scale-out: 1,000 rows of a transaction behind another relay's claim, then free work.
    The second window starts after that transaction, and the claim takes the free rows."""
    held_tx = [link(n, 1, heads=(100, None), successors=(n + 1, None)) for n in range(101, 1001)]
    free_tx = [link(n, 2, heads=(1001, None), successors=(n + 1, None)) for n in range(1001, 1201)]
    outbox = Outbox([*held_tx, *free_tx], {ident(100): Holder(ident(100))})
    _candidates, result = claim_windows(outbox.read, outbox.holders_of, limit=100)
    assert result.take == [ident(n) for n in range(1001, 1101)]
    assert [size for _after, size in outbox.reads] == [100, 200]
    assert outbox.reads[1][0] == (held_tx[0].staged_at, LAST_ID)


def test_a_claim_reads_a_bounded_number_of_rows() -> None:
    """Rows held one by one by claims in flight (a hot key): the claim stops reading after
    MOST_READ_BATCHES batches, whatever is left."""
    rows = [link(n, n, "k", heads=(n, 1), successors=(None, n + 1)) for n in range(2, 5000)]
    outbox = Outbox(rows, {ident(1): Holder(ident(1))})
    candidates, result = claim_windows(outbox.read, outbox.holders_of, limit=10)
    assert not result.take
    assert len(candidates) == sum(size for _after, size in outbox.reads)
    assert sum(size for _after, size in outbox.reads) <= 10 * MOST_READ_BATCHES
