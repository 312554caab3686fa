"""Every statement sqla-outbox runs, built with SQLAlchemy Core from the mapped table.

One named function per statement, so the SQL can be read in one place, compared with the golden
files of its compiled SQL (``tests/golden``), and honours the table's schema. Nothing here
executes anything; the stores (:mod:`sqla_outbox.stores`) run these statements.

By job:

* :mod:`~sqla_outbox.queries.terms`: the table, a message's columns, and the predicates every
  statement shares (holding, claimable, stuck), with the one rule of whose clock is "now".
* :mod:`~sqla_outbox.queries.staging`: the INSERT of an enqueuing transaction's commit.
* :mod:`~sqla_outbox.queries.claim`: the claim: a window of candidates with their
  predecessors, the holders, stamp and park; PostgreSQL's one-statement claim.
* :mod:`~sqla_outbox.queries.write_back`: mark, charge, hand back, renew, all fenced.
* :mod:`~sqla_outbox.queries.parking`: unparking, the sweep, rows parked until due, the idle
  plan.
* :mod:`~sqla_outbox.queries.operating`: the operators' reads and changes: status, dead
  letters, the metrics backlog, purge.

Statements that take a set of rows take their ids as one parameter (``= ANY(:ids)`` on
PostgreSQL, an expanding ``IN`` elsewhere). Every statement a relay runs after its claim is
**fenced**: it touches only rows still stamped with that claim's token and unpublished, so a
relay that stalled past its lease cannot change rows another relay holds now.
"""

from sqla_outbox.queries.claim import (
    fast_claim_stmt,
    holders_stmt,
    links_stmt,
    park_rows_stmt,
    stamp_stmt,
    window_stmt,
)
from sqla_outbox.queries.operating import (
    backlog_stmt,
    claims_stmt,
    dead_letters_stmt,
    delete_dead_stmt,
    holding_stmt,
    notify_stmt,
    pending_stmt,
    purge_stmt,
    retry_dead_stmt,
    status_stmt,
)
from sqla_outbox.queries.parking import (
    analyze_stmt,
    free_parked_stmt,
    idle_stmt,
    park_waiting_stmt,
    parked_window,
    sweep_parked_stmt,
    sweep_stmt,
    unpark_behind_stmt,
    unpark_rows_stmt,
    waiting_head_stmt,
    wake_stmt,
    window_end_stmt,
)
from sqla_outbox.queries.staging import stage_rows, stage_stmt
from sqla_outbox.queries.terms import CLAIM_FIELDS, MESSAGE_FIELDS, ORDERS
from sqla_outbox.queries.write_back import (
    fail_stmt,
    mark_published_stmt,
    release_stmt,
    renew_stmt,
    settle_stmt,
    unclaim_stmt,
)

__all__ = [
    "CLAIM_FIELDS",
    "MESSAGE_FIELDS",
    "ORDERS",
    "analyze_stmt",
    "backlog_stmt",
    "claims_stmt",
    "dead_letters_stmt",
    "delete_dead_stmt",
    "fail_stmt",
    "fast_claim_stmt",
    "free_parked_stmt",
    "holders_stmt",
    "holding_stmt",
    "idle_stmt",
    "links_stmt",
    "mark_published_stmt",
    "notify_stmt",
    "park_rows_stmt",
    "park_waiting_stmt",
    "parked_window",
    "pending_stmt",
    "purge_stmt",
    "release_stmt",
    "renew_stmt",
    "retry_dead_stmt",
    "settle_stmt",
    "stage_rows",
    "stage_stmt",
    "stamp_stmt",
    "status_stmt",
    "sweep_parked_stmt",
    "sweep_stmt",
    "unclaim_stmt",
    "unpark_behind_stmt",
    "unpark_rows_stmt",
    "waiting_head_stmt",
    "wake_stmt",
    "window_end_stmt",
    "window_stmt",
]
