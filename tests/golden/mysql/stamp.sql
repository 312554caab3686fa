UPDATE outbox
SET claimed_by=%s,
    claimed_at=%s
WHERE outbox.id IN (__[POSTCOMPILE_ids])
