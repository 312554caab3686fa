UPDATE outbox
SET parked=0,
    parked_behind=NULL
WHERE outbox.parked_behind IN (__[POSTCOMPILE_ids])
