UPDATE outbox
SET parked=FALSE,
           parked_behind=NULL
WHERE outbox.id IN (__[POSTCOMPILE_ids])
  AND outbox.parked = 1
  AND outbox.wake_at IS NULL
