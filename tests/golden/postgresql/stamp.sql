UPDATE outbox
SET claimed_by=%(token)s::VARCHAR,
    claimed_at=now()
WHERE outbox.id = ANY (%(ids)s::UUID[])
