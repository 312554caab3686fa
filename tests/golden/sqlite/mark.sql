UPDATE outbox
SET published_at=?
WHERE outbox.claimed_by = ?
  AND outbox.published_at IS NULL
  AND outbox.id IN (__[POSTCOMPILE_ids])
