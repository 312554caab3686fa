UPDATE outbox
SET claimed_by=NULL,
    claimed_at=NULL
WHERE outbox.claimed_by = %(token)s::VARCHAR
  AND outbox.published_at IS NULL
