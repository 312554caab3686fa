SELECT window_last.staged_at AS last_staged_at,
       window_last.id AS last_id,

  (SELECT count(*) AS count_1
   FROM
     (SELECT parked_row.id AS id,
             parked_row.staged_at AS staged_at,
             parked_row.parked_behind AS parked_behind,
             parked_row.wake_at AS wake_at
      FROM outbox AS parked_row
      WHERE parked_row.parked = 1
        AND parked_row.staged_at >= ?
        AND (parked_row.staged_at > ?
             OR parked_row.id > ?)
      ORDER BY parked_row.staged_at,
               parked_row.id
      LIMIT ?
      OFFSET ?) AS parked_row) AS READ
FROM
  (SELECT 1 AS one) AS one
LEFT OUTER JOIN
  (SELECT parked_row.staged_at AS staged_at,
          parked_row.id AS id
   FROM
     (SELECT parked_row.id AS id,
             parked_row.staged_at AS staged_at,
             parked_row.parked_behind AS parked_behind,
             parked_row.wake_at AS wake_at
      FROM outbox AS parked_row
      WHERE parked_row.parked = 1
        AND parked_row.staged_at >= ?
        AND (parked_row.staged_at > ?
             OR parked_row.id > ?)
      ORDER BY parked_row.staged_at,
               parked_row.id
      LIMIT ?
      OFFSET ?) AS parked_row
   ORDER BY parked_row.staged_at DESC,
            parked_row.id DESC
   LIMIT 1
   OFFSET ?) AS window_last ON 1 = 1
