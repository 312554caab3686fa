SELECT count(*) AS pending,
       count(CASE
                 WHEN (outbox.dead_at IS NOT NULL) THEN 1
             END) AS dead,
       min(CASE
               WHEN (outbox.run_at <= now()) THEN CASE
                                                      WHEN (outbox.run_at > outbox.staged_at) THEN outbox.run_at
                                                      ELSE outbox.staged_at
                                                  END
           END) AS oldest_due_at,
       now() AS NOW
FROM outbox
WHERE outbox.published_at IS NULL
