UPDATE outbox
SET claimed_by=NULL,
    claimed_at=NULL,
    attempts=(outbox.attempts + %(attempts_1)s::INTEGER),
    last_error=%(error)s::VARCHAR,
    retry_at=CASE
                 WHEN %(dead)s THEN NULL
                 ELSE now() + %(delay)s
             END,
             dead_at=CASE
                         WHEN %(dead)s THEN now()
                         ELSE NULL
                     END
WHERE outbox.id = %(failed_id)s::UUID
  AND outbox.claimed_by = %(token)s::VARCHAR
  AND outbox.published_at IS NULL
