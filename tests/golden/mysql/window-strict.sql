SELECT outbox.id,
       outbox.job,
       outbox.queue,
       CAST(outbox.input AS CHAR) AS INPUT,
       outbox.idempotency_key,
       outbox.max_attempts,
       outbox.run_at,
       outbox.staged_at,
       outbox.tenant_id,
       outbox.traceparent,
       outbox.enqueued_by,
       outbox.ordering_key,
       outbox.attempts
FROM outbox USE INDEX (ix_outbox_claimable)
WHERE outbox.published_at IS NULL
  AND outbox.dead_at IS NULL
  AND outbox.parked = 0
  AND outbox.run_at <= %s
  AND (outbox.retry_at IS NULL
       OR outbox.retry_at <= %s)
  AND (outbox.claimed_at IS NULL
       OR outbox.claimed_at < %s)
  AND NOT (outbox.claimed_by <=> %s)
  AND (NOT (EXISTS
              (SELECT failing.staged_at,
                      failing.id
               FROM outbox AS failing
               WHERE failing.published_at IS NULL
                 AND failing.run_at <= %s
                 AND NOT (failing.claimed_by <=> %s)
                 AND failing.attempts > 0
               ORDER BY failing.staged_at,
                        failing.id
               LIMIT 1))
       OR (outbox.staged_at,
           outbox.id) <=
         (SELECT failing.staged_at,
                 failing.id
          FROM outbox AS failing
          WHERE failing.published_at IS NULL
            AND failing.run_at <= %s
            AND NOT (failing.claimed_by <=> %s)
            AND failing.attempts > 0
          ORDER BY failing.staged_at,
                   failing.id
          LIMIT 1))
  AND outbox.staged_at >= %s
  AND (outbox.staged_at > %s
       OR outbox.id > %s)
ORDER BY outbox.staged_at,
         outbox.id
LIMIT __[POSTCOMPILE_window]
FOR
UPDATE SKIP LOCKED
