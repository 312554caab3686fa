SELECT min(CASE
               WHEN (claimable.run_at > ?) THEN claimable.run_at
           END) AS next_run_at,
       min(CASE
               WHEN (claimable.claimed_at IS NULL) THEN claimable.retry_at
           END) AS next_retry_at,
       min(claimable.claimed_at) AS oldest_claim,
  (SELECT some_parked.staged_at
   FROM outbox AS some_parked
   WHERE some_parked.parked = 1
   ORDER BY some_parked.staged_at
   LIMIT 1
   OFFSET ?) IS NOT NULL AS parked,
                            ? AS NOW
FROM
  (SELECT outbox.run_at AS run_at,
          outbox.retry_at AS retry_at,
          outbox.claimed_at AS claimed_at
   FROM outbox
   WHERE outbox.published_at IS NULL
     AND outbox.dead_at IS NULL
     AND NOT outbox.parked
   ORDER BY outbox.staged_at,
            outbox.id) AS claimable
