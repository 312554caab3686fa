SELECT outbox.id,
       outbox.job,
       outbox.queue,
       CAST(outbox.input AS TEXT) AS INPUT,
       outbox.idempotency_key,
       outbox.max_attempts,
       outbox.run_at,
       outbox.staged_at,
       outbox.tenant_id,
       outbox.traceparent,
       outbox.enqueued_by,
       outbox.ordering_key,
       outbox.attempts,

  (SELECT staged_at_head.id
   FROM outbox AS staged_at_head
   WHERE staged_at_head.staged_at = outbox.staged_at
     AND staged_at_head.published_at IS NULL
     AND staged_at_head.run_at <= ?
     AND staged_at_head.claimed_by IS NOT ?
   ORDER BY staged_at_head.staged_at,
            staged_at_head.id
   LIMIT 1
   OFFSET ?) AS transaction_head,

  (SELECT ordering_key_head.id
   FROM outbox AS ordering_key_head
   WHERE ordering_key_head.ordering_key = outbox.ordering_key
     AND ordering_key_head.published_at IS NULL
     AND ordering_key_head.run_at <= ?
     AND ordering_key_head.claimed_by IS NOT ?
   ORDER BY ordering_key_head.staged_at,
            ordering_key_head.id
   LIMIT 1
   OFFSET ?) AS key_head,

  (SELECT staged_at_next.id
   FROM outbox AS staged_at_next
   WHERE staged_at_next.staged_at = outbox.staged_at
     AND staged_at_next.id > outbox.id
     AND staged_at_next.published_at IS NULL
     AND staged_at_next.run_at <= ?
     AND staged_at_next.claimed_by IS NOT ?
   ORDER BY staged_at_next.staged_at,
            staged_at_next.id
   LIMIT 1
   OFFSET ?) AS transaction_successor,

  (SELECT ordering_key_next.id
   FROM outbox AS ordering_key_next
   WHERE ordering_key_next.ordering_key = outbox.ordering_key
     AND ordering_key_next.staged_at >= outbox.staged_at
     AND (ordering_key_next.staged_at > outbox.staged_at
          OR ordering_key_next.id > outbox.id)
     AND ordering_key_next.published_at IS NULL
     AND ordering_key_next.run_at <= ?
     AND ordering_key_next.claimed_by IS NOT ?
   ORDER BY ordering_key_next.staged_at,
            ordering_key_next.id
   LIMIT 1
   OFFSET ?) AS key_successor
FROM outbox
WHERE outbox.published_at IS NULL
  AND outbox.dead_at IS NULL
  AND NOT outbox.parked
  AND outbox.run_at <= ?
  AND (outbox.retry_at IS NULL
       OR outbox.retry_at <= ?)
  AND (outbox.claimed_at IS NULL
       OR outbox.claimed_at < ?)
  AND outbox.claimed_by IS NOT ?
  AND (NOT (EXISTS
              (SELECT failing.staged_at,
                      failing.id
               FROM outbox AS failing
               WHERE failing.published_at IS NULL
                 AND failing.run_at <= ?
                 AND failing.claimed_by IS NOT ?
                 AND failing.attempts > 0
               ORDER BY failing.staged_at,
                        failing.id
               LIMIT 1
               OFFSET ?))
       OR (outbox.staged_at,
           outbox.id) <=
         (SELECT failing.staged_at,
                 failing.id
          FROM outbox AS failing
          WHERE failing.published_at IS NULL
            AND failing.run_at <= ?
            AND failing.claimed_by IS NOT ?
            AND failing.attempts > 0
          ORDER BY failing.staged_at,
                   failing.id
          LIMIT 1
          OFFSET ?))
  AND outbox.staged_at >= ?
  AND (outbox.staged_at > ?
       OR outbox.id > ?)
ORDER BY outbox.staged_at,
         outbox.id
LIMIT __[POSTCOMPILE_window]
OFFSET ?
