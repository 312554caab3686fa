SELECT parked_row.id
FROM
  (SELECT parked_row.id AS id,
          parked_row.staged_at AS staged_at,
          parked_row.parked_behind AS parked_behind,
          parked_row.wake_at AS wake_at
   FROM outbox AS parked_row
   WHERE parked_row.parked = 1
     AND parked_row.staged_at >= %s
     AND (parked_row.staged_at > %s
          OR parked_row.id > %s)
   ORDER BY parked_row.staged_at,
            parked_row.id
   LIMIT %s) AS parked_row
LEFT OUTER JOIN outbox AS holder ON holder.id = parked_row.parked_behind
WHERE parked_row.wake_at IS NULL
  AND (holder.id IS NULL
       OR holder.published_at IS NOT NULL)
