SELECT outbox.id,
       outbox.job,
       outbox.queue,
       outbox.input,
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
     AND staged_at_head.run_at <= now()
     AND staged_at_head.claimed_by IS DISTINCT
     FROM %(done)s::VARCHAR
   ORDER BY staged_at_head.staged_at,
            staged_at_head.id
   LIMIT 1) AS transaction_head,

  (SELECT ordering_key_head.id
   FROM outbox AS ordering_key_head
   WHERE ordering_key_head.ordering_key = outbox.ordering_key
     AND ordering_key_head.published_at IS NULL
     AND ordering_key_head.run_at <= now()
     AND ordering_key_head.claimed_by IS DISTINCT
     FROM %(done)s::VARCHAR
   ORDER BY ordering_key_head.staged_at,
            ordering_key_head.id
   LIMIT 1) AS key_head,

  (SELECT staged_at_next.id
   FROM outbox AS staged_at_next
   WHERE staged_at_next.staged_at = outbox.staged_at
     AND staged_at_next.id > outbox.id
     AND staged_at_next.published_at IS NULL
     AND staged_at_next.run_at <= now()
     AND staged_at_next.claimed_by IS DISTINCT
     FROM %(done)s::VARCHAR
   ORDER BY staged_at_next.staged_at,
            staged_at_next.id
   LIMIT 1) AS transaction_successor,

  (SELECT ordering_key_next.id
   FROM outbox AS ordering_key_next
   WHERE ordering_key_next.ordering_key = outbox.ordering_key
     AND ordering_key_next.staged_at >= outbox.staged_at
     AND (ordering_key_next.staged_at > outbox.staged_at
          OR ordering_key_next.id > outbox.id)
     AND ordering_key_next.published_at IS NULL
     AND ordering_key_next.run_at <= now()
     AND ordering_key_next.claimed_by IS DISTINCT
     FROM %(done)s::VARCHAR
   ORDER BY ordering_key_next.staged_at,
            ordering_key_next.id
   LIMIT 1) AS key_successor
FROM outbox
WHERE outbox.published_at IS NULL
  AND outbox.dead_at IS NULL
  AND NOT outbox.parked
  AND outbox.run_at <= now()
  AND (outbox.retry_at IS NULL
       OR outbox.retry_at <= now())
  AND (outbox.claimed_at IS NULL
       OR outbox.claimed_at < now() - %(lease)s)
  AND outbox.claimed_by IS DISTINCT
  FROM %(done)s::VARCHAR
  AND outbox.staged_at >= %(after_staged_at)s::TIMESTAMP WITH TIME ZONE
  AND (outbox.staged_at > %(after_staged_at)s::TIMESTAMP WITH TIME ZONE
       OR outbox.id > %(after_id)s::UUID)
ORDER BY outbox.staged_at,
         outbox.id
LIMIT __[POSTCOMPILE_window]
FOR
UPDATE SKIP LOCKED
