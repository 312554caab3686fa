UPDATE outbox
SET parked=%(parked)s,
    parked_behind=%(behind)s::UUID
WHERE outbox.id = ANY (%(ids)s::UUID[])
