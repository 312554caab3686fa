UPDATE outbox
SET parked=FALSE,
           parked_behind=NULL
WHERE outbox.parked_behind IN
    (SELECT holder.id
     FROM outbox AS holder
     WHERE holder.dead_at IS NOT NULL
       AND holder.published_at IS NULL)
