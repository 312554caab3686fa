UPDATE outbox
SET claimed_by=NULL,
    claimed_at=NULL,
    parked=?,
    parked_behind=?
WHERE outbox.claimed_by = ?
  AND outbox.published_at IS NULL
  AND outbox.id IN (__[POSTCOMPILE_ids])
