INSERT INTO outbox (id, job, queue, INPUT, idempotency_key, max_attempts, run_at, staged_at, tenant_id, traceparent, enqueued_by, claimed_by, claimed_at, published_at, attempts, last_error, ordering_key, retry_at, dead_at, parked, wake_at, parked_behind)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
