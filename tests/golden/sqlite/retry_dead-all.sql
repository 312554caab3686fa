UPDATE outbox
SET claimed_by=NULL,
    claimed_at=NULL,
    attempts=?,
    retry_at=NULL,
    dead_at=NULL
WHERE outbox.published_at IS NULL
  AND outbox.dead_at IS NOT NULL RETURNING id
