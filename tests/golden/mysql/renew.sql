UPDATE outbox
SET claimed_at=%s
WHERE outbox.claimed_by = %s
  AND outbox.published_at IS NULL
  AND outbox.id IN (__[POSTCOMPILE_ids])
