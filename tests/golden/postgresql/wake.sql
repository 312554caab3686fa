UPDATE outbox
SET parked=%(parked)s,
    wake_at=NULL
WHERE outbox.id = ANY (array(
                               (SELECT waking_row.id
                                FROM outbox AS waking_row
                                WHERE waking_row.wake_at IS NOT NULL
                                  AND waking_row.wake_at <= now() + %(wake_ahead)s
                                  FOR
                                  UPDATE SKIP LOCKED)))
