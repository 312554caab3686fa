WITH parked_row AS
  (SELECT parked_row.id AS id,
          parked_row.staged_at AS staged_at,
          parked_row.parked_behind AS parked_behind,
          parked_row.wake_at AS wake_at
   FROM outbox AS parked_row
   WHERE parked_row.parked
     AND parked_row.staged_at >= %(after_staged_at)s::TIMESTAMP WITH TIME ZONE
     AND (parked_row.staged_at > %(after_staged_at)s::TIMESTAMP WITH TIME ZONE
          OR parked_row.id > %(after_id)s::UUID)
   ORDER BY parked_row.staged_at,
            parked_row.id
   LIMIT %(limit)s),
     unparked_rows AS
  (UPDATE outbox
   SET parked=FALSE,
              parked_behind=NULL
   WHERE outbox.id = ANY (array(
                                  (SELECT free_row.id
                                   FROM outbox AS free_row
                                   WHERE free_row.id = ANY (array(
                                                                    (SELECT parked_row.id
                                                                     FROM parked_row
                                                                     LEFT OUTER JOIN outbox AS holder ON holder.id = parked_row.parked_behind
                                                                     WHERE parked_row.wake_at IS NULL
                                                                       AND (holder.id IS NULL
                                                                            OR holder.published_at IS NOT NULL))))
                                     AND free_row.parked
                                     AND free_row.wake_at IS NULL
                                     FOR
                                     UPDATE OF free_row SKIP LOCKED))) RETURNING outbox.id),
     woken_rows AS
  (UPDATE outbox
   SET parked=%(param_1)s,
       wake_at=NULL
   WHERE outbox.id = ANY (array(
                                  (SELECT waking_row.id
                                   FROM outbox AS waking_row
                                   WHERE waking_row.wake_at IS NOT NULL
                                     AND waking_row.wake_at <= now() + %(wake_ahead)s
                                     FOR
                                     UPDATE SKIP LOCKED))) RETURNING outbox.id),
     parked_rows AS
  (UPDATE outbox
   SET parked=%(param_2)s,
       wake_at=CASE
                   WHEN (outbox.retry_at > outbox.run_at) THEN outbox.retry_at
                   ELSE outbox.run_at
               END
   WHERE outbox.id = ANY (array(
                                  (SELECT waiting_row.id
                                   FROM outbox AS waiting_row
                                   WHERE waiting_row.id = ANY (array(
                                                                       (SELECT head.id
                                                                        FROM
                                                                          (SELECT head_row.id AS id, head_row.run_at AS run_at, head_row.retry_at AS retry_at, head_row.claimed_by AS claimed_by
                                                                           FROM outbox AS head_row
                                                                           WHERE head_row.published_at IS NULL
                                                                             AND head_row.dead_at IS NULL
                                                                             AND NOT head_row.parked
                                                                           ORDER BY head_row.staged_at, head_row.id
                                                                           LIMIT __[POSTCOMPILE_head]) AS head
                                                                        WHERE head.claimed_by IS NULL
                                                                          AND CASE
                                                                                  WHEN (head.retry_at > head.run_at) THEN head.retry_at
                                                                                  ELSE head.run_at
                                                                              END > now() + %(park_ahead)s)))
                                     AND waiting_row.published_at IS NULL
                                     AND waiting_row.dead_at IS NULL
                                     AND NOT waiting_row.parked
                                     AND waiting_row.claimed_by IS NULL
                                     AND CASE
                                             WHEN (waiting_row.retry_at > waiting_row.run_at) THEN waiting_row.retry_at
                                             ELSE waiting_row.run_at
                                         END > now() + %(park_ahead)s
                                     FOR
                                     UPDATE OF waiting_row SKIP LOCKED))) RETURNING outbox.id)
SELECT
  (SELECT count(*) AS count_1
   FROM unparked_rows) AS unparked,

  (SELECT count(*) AS count_2
   FROM woken_rows) AS woken,

  (SELECT count(*) AS count_3
   FROM parked_rows) AS parked,
       window_end.last_staged_at,
       window_end.last_id,
       window_end.read
FROM
  (SELECT window_last.staged_at AS last_staged_at,
          window_last.id AS last_id,

     (SELECT count(*) AS count_4
      FROM parked_row) AS READ
   FROM
     (SELECT 1 AS one) AS one
   LEFT OUTER JOIN
     (SELECT parked_row.staged_at AS staged_at,
             parked_row.id AS id
      FROM parked_row
      ORDER BY parked_row.staged_at DESC,
               parked_row.id DESC
      LIMIT 1) AS window_last ON TRUE) AS window_end
