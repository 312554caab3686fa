UPDATE outbox
SET claimed_by=NULL,
    claimed_at=NULL,
    parked=%(park)s,
    parked_behind=%(behind)s::UUID
WHERE outbox.claimed_by = %(token)s::VARCHAR
  AND outbox.published_at IS NULL
  AND outbox.id = ANY (%(ids)s::UUID[])
