SELECT count(*) AS pending,
       count(CASE
                 WHEN (outbox.dead_at IS NULL
                       AND outbox.run_at <= ?
                       AND outbox.parked = 0
                       AND (outbox.retry_at IS NULL
                            OR outbox.retry_at <= ?)) THEN 1
             END) AS due,
       min(CASE
               WHEN (outbox.run_at <= ?) THEN CASE
                                                  WHEN (outbox.run_at > outbox.staged_at) THEN outbox.run_at
                                                  ELSE outbox.staged_at
                                              END
           END) AS oldest_due_at,
       count(CASE
                 WHEN (outbox.attempts > 0) THEN 1
             END) AS failing,
       count(CASE
                 WHEN (outbox.dead_at IS NOT NULL) THEN 1
             END) AS dead,
       count(CASE
                 WHEN (outbox.dead_at IS NULL
                       AND outbox.retry_at > ?) THEN 1
             END) AS backing_off,
       count(CASE
                 WHEN (outbox.dead_at IS NULL
                       AND outbox.parked = 1
                       AND outbox.wake_at IS NULL) THEN 1
             END) AS parked
FROM outbox
WHERE outbox.published_at IS NULL
