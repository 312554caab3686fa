UPDATE outbox
SET parked=FALSE,
           parked_behind=NULL
WHERE outbox.parked_behind IN (__[POSTCOMPILE_ids])
