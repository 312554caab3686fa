UPDATE outbox
SET parked=%(parked)s,
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
                                  UPDATE OF waiting_row SKIP LOCKED)))
