UPDATE outbox
SET claimed_by=?,
    claimed_at=?
WHERE outbox.id IN (__[POSTCOMPILE_ids])
