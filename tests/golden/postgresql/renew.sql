UPDATE outbox
SET claimed_at=now()
WHERE outbox.claimed_by = %(token)s::VARCHAR
  AND outbox.published_at IS NULL
  AND outbox.id = ANY (%(ids)s::UUID[])
