UPDATE outbox
SET parked=%s,
    parked_behind=%s
WHERE outbox.id IN (__[POSTCOMPILE_ids])
