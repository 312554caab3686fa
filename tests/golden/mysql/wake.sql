UPDATE outbox
SET parked=%s,
    wake_at=NULL
WHERE outbox.wake_at IS NOT NULL
  AND outbox.wake_at <= %s
