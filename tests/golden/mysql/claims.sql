SELECT outbox.claimed_by,
       count(*) AS held,
       min(outbox.claimed_at) AS claimed_at
FROM outbox
WHERE outbox.published_at IS NULL
  AND outbox.claimed_by IS NOT NULL
GROUP BY outbox.claimed_by
ORDER BY outbox.claimed_by
