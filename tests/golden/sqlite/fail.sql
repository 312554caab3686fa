UPDATE outbox
SET claimed_by=NULL,
    claimed_at=NULL,
    attempts=(outbox.attempts + ?),
    last_error=?,
    retry_at=CASE
                 WHEN ? THEN NULL
                 ELSE ?
             END,
             dead_at=CASE
                         WHEN ? THEN ?
                         ELSE NULL
                     END
WHERE outbox.id = ?
  AND outbox.claimed_by = ?
  AND outbox.published_at IS NULL
