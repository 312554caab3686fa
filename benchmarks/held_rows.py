"""The held rows of workloads 3 and 8: 10,000 rows no claim may take, behind 100 dead letters.

Written in one ``INSERT ... SELECT generate_series`` with time-ordered ids, ahead of any backlog
in claim order (``staged_at`` a day ago): :data:`DEAD_LETTERS` blocks of :data:`BLOCK` rows,
each a dead letter (``dead_at`` set, ``attempts`` 3, ``last_error``) with an ordering key of its
own, :data:`SAME_TRANSACTION` - 1 more rows of its transaction (same ``staged_at``, no key), and
later rows of its key for the rest of the block. PostgreSQL only.
"""

from __future__ import annotations

__all__ = [
    "BLOCK",
    "DEAD_LETTERS",
    "HELD_JOB",
    "HELD_ROWS",
    "INSERT_HELD",
    "PARK_HELD",
    "SAME_TRANSACTION",
    "UNPARK_HELD",
]

DEAD_LETTERS = 100
BLOCK = 100
"""Rows per dead letter, the dead letter included."""
SAME_TRANSACTION = 10
"""Rows of each dead letter's transaction, the dead letter included."""
HELD_ROWS = DEAD_LETTERS * BLOCK
HELD_JOB = "held_back"

INSERT_HELD = f"""
INSERT INTO outbox (id, job, queue, input, idempotency_key, max_attempts, run_at, staged_at,
                    ordering_key, attempts, last_error, dead_at)
SELECT id, '{HELD_JOB}', 'default', jsonb_build_object('order_id', g), id::text, 3, t, t,
       CASE WHEN pos = 0 OR pos >= {SAME_TRANSACTION} THEN 'held-' || block END,
       CASE WHEN pos = 0 THEN 3 ELSE 0 END,
       CASE WHEN pos = 0 THEN 'bench: refused three times' END,
       CASE WHEN pos = 0 THEN t + interval '1 minute' END
FROM (
    SELECT g, block, pos, t,
           (substr(ms, 1, 8) || '-' || substr(ms, 9, 4) || '-7000-8000-'
            || lpad(to_hex(g), 12, '0'))::uuid AS id
    FROM (
        SELECT g, block, pos, t,
               lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') AS ms
        FROM (
            SELECT g, g / {BLOCK} AS block, mod(g, {BLOCK}) AS pos,
                   date_trunc('second', now()) - interval '1 day' + (g / {BLOCK}) * interval '1 s'
                   + CASE WHEN mod(g, {BLOCK}) < {SAME_TRANSACTION} THEN interval '0'
                          ELSE mod(g, {BLOCK}) * interval '1 ms' END AS t
            FROM generate_series(0, {HELD_ROWS - 1}) AS g
        ) AS placed
    ) AS stamped
) AS held
"""
"""The held rows: per block, the dead letter first (lowest id of its transaction), the rest of
its transaction at the same ``staged_at``, then its key's rows a millisecond apart."""


_PARK_BEHIND_DEAD = f"""
UPDATE outbox AS waiting SET parked = true, parked_behind = dead.id
FROM outbox AS dead
WHERE waiting.job = '{HELD_JOB}' AND waiting.dead_at IS NULL
  AND dead.job = '{HELD_JOB}' AND dead.dead_at IS NOT NULL
  AND {{same_block}}
"""
PARK_HELD = (
    _PARK_BEHIND_DEAD.format(same_block="dead.ordering_key = waiting.ordering_key"),
    _PARK_BEHIND_DEAD.format(
        same_block="waiting.ordering_key IS NULL AND dead.staged_at = waiting.staged_at"
    ),
)
"""Park every held row but the dead letters behind its block's dead letter, as a relay that has
met them has: the rows of its key (each block's key is its own), then the rest of its
transaction. Two equality joins, each a hash join once the table is analysed (one join on
either condition, or one planned without statistics, compares every pair of rows)."""

UNPARK_HELD = (
    f"UPDATE outbox SET parked = false, parked_behind = NULL WHERE job = '{HELD_JOB}' AND parked"
)
"""Unpark them again, as before any relay met them."""
