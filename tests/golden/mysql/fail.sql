UPDATE outbox
SET claimed_by=NULL,
    claimed_at=NULL,
    attempts=(outbox.attempts + %s),
    last_error=%s,
    retry_at=CASE
                 WHEN %s THEN NULL
                 ELSE %s
             END,
             dead_at=CASE
                         WHEN %s THEN %s
                         ELSE NULL
                     END
WHERE outbox.id = %s
  AND outbox.claimed_by = %s
  AND outbox.published_at IS NULL
