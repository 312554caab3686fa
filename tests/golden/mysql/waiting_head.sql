SELECT head.id
FROM
  (SELECT head_row.id AS id,
          head_row.run_at AS run_at,
          head_row.retry_at AS retry_at,
          head_row.claimed_by AS claimed_by
   FROM outbox AS head_row USE INDEX (ix_outbox_claimable)
   WHERE head_row.published_at IS NULL
     AND head_row.dead_at IS NULL
     AND head_row.parked = 0
   ORDER BY head_row.staged_at,
            head_row.id
   LIMIT __[POSTCOMPILE_head]) AS head
WHERE head.claimed_by IS NULL
  AND CASE
          WHEN (head.retry_at > head.run_at) THEN head.retry_at
          ELSE head.run_at
      END > %s
