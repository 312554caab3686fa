UPDATE outbox
SET parked=FALSE,
           parked_behind=NULL
WHERE outbox.id = ANY (array(
                               (SELECT free_row.id
                                FROM outbox AS free_row
                                WHERE free_row.id = ANY (array(
                                                                 (SELECT parked_row.id
                                                                  FROM
                                                                    (SELECT parked_row.id AS id, parked_row.staged_at AS staged_at, parked_row.parked_behind AS parked_behind, parked_row.wake_at AS wake_at
                                                                     FROM outbox AS parked_row
                                                                     WHERE parked_row.parked
                                                                       AND parked_row.staged_at >= %(after_staged_at)s::TIMESTAMP WITH TIME ZONE
                                                                       AND (parked_row.staged_at > %(after_staged_at)s::TIMESTAMP WITH TIME ZONE
                                                                            OR parked_row.id > %(after_id)s::UUID)
                                                                     ORDER BY parked_row.staged_at, parked_row.id
                                                                     LIMIT %(limit)s) AS parked_row
                                                                  LEFT OUTER JOIN outbox AS holder ON holder.id = parked_row.parked_behind
                                                                  WHERE parked_row.wake_at IS NULL
                                                                    AND (holder.id IS NULL
                                                                         OR holder.published_at IS NOT NULL))))
                                  AND free_row.parked
                                  AND free_row.wake_at IS NULL
                                  FOR
                                  UPDATE OF free_row SKIP LOCKED)))
