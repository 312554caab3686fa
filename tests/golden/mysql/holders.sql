SELECT outbox.id,
       outbox.published_at IS NOT NULL AS published,
                                          outbox.dead_at IS NOT NULL
OR outbox.retry_at > %s AS stuck,
   outbox.parked,
   outbox.parked_behind,
   outbox.parked = 1
AND outbox.wake_at IS NULL
AND (behind.id IS NULL
     OR behind.published_at IS NOT NULL) AS stale,
    behind.published_at IS NULL
AND (behind.dead_at IS NOT NULL
     OR behind.retry_at > %s) AS behind_stuck
FROM outbox
LEFT OUTER JOIN outbox AS behind ON behind.id = outbox.parked_behind
WHERE outbox.id IN (__[POSTCOMPILE_ids])
