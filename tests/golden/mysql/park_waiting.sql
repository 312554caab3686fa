UPDATE outbox
SET parked=%s,
    wake_at=CASE
                WHEN (outbox.retry_at > outbox.run_at) THEN outbox.retry_at
                ELSE outbox.run_at
            END
WHERE outbox.id IN (__[POSTCOMPILE_ids])
  AND outbox.published_at IS NULL
  AND outbox.dead_at IS NULL
  AND outbox.parked = 0
  AND outbox.claimed_by IS NULL
  AND CASE
          WHEN (outbox.retry_at > outbox.run_at) THEN outbox.retry_at
          ELSE outbox.run_at
      END > %s
