UPDATE outbox
SET claimed_by=NULL,
    claimed_at=NULL,
    parked=%s,
    parked_behind=%s
WHERE outbox.claimed_by = %s
  AND outbox.published_at IS NULL
  AND outbox.id IN (__[POSTCOMPILE_ids])
