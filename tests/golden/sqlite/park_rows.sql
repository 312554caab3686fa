UPDATE outbox
SET parked=?,
    parked_behind=?
WHERE outbox.id IN (__[POSTCOMPILE_ids])
