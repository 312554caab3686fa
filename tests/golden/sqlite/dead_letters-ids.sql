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
       outbox.last_error,
       outbox.retry_at,
       outbox.dead_at
FROM outbox
WHERE outbox.published_at IS NULL
  AND outbox.dead_at IS NOT NULL
  AND outbox.id IN (__[POSTCOMPILE_ids])
ORDER BY outbox.staged_at,
         outbox.id
