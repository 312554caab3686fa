WITH candidates AS
  (SELECT outbox.id AS id,
          outbox.staged_at AS staged_at,
          outbox.ordering_key AS ordering_key
   FROM outbox
   WHERE outbox.published_at IS NULL
     AND outbox.dead_at IS NULL
     AND NOT outbox.parked
     AND outbox.run_at <= now()
     AND (outbox.retry_at IS NULL
          OR outbox.retry_at <= now())
     AND (outbox.claimed_at IS NULL
          OR outbox.claimed_at < now() - %(lease)s)
     AND outbox.claimed_by IS DISTINCT
     FROM %(done)s::VARCHAR
     AND outbox.staged_at >=
       (SELECT %(after_staged_at)s::TIMESTAMP WITH TIME ZONE AS anon_3)
     AND (outbox.staged_at >
            (SELECT %(after_staged_at)s::TIMESTAMP WITH TIME ZONE AS anon_3)
          OR outbox.id >
            (SELECT %(after_id)s::UUID AS anon_4))
   ORDER BY outbox.staged_at,
            outbox.id
   LIMIT __[POSTCOMPILE_limit]
   FOR UPDATE SKIP LOCKED),
     gate AS
  (SELECT CASE
              WHEN (
                      (SELECT count(*) AS count_1
                       FROM
                         (SELECT 1
                          FROM outbox AS ahead
                          WHERE ahead.published_at IS NULL
                            AND ahead.run_at <= now()
                            AND ahead.claimed_by IS DISTINCT
                            FROM %(done)s::VARCHAR
                            AND ahead.dead_at IS NULL
                            AND NOT ahead.parked
                            AND (ahead.retry_at IS NULL
                                 OR ahead.retry_at <= now())
                            AND ahead.staged_at >=
                              (SELECT %(after_staged_at)s::TIMESTAMP WITH TIME ZONE AS anon_1)
                            AND (ahead.staged_at >
                                   (SELECT %(after_staged_at)s::TIMESTAMP WITH TIME ZONE AS anon_1)
                                 OR ahead.id >
                                   (SELECT %(after_id)s::UUID AS anon_2))
                            AND (ahead.staged_at,
                                 ahead.id) <=
                              (SELECT candidates.staged_at,
                                      candidates.id
                               FROM candidates
                               ORDER BY candidates.staged_at DESC,
                                        candidates.id DESC
                               LIMIT 1)
                          ORDER BY ahead.staged_at,
                                   ahead.id
                          LIMIT __[POSTCOMPILE_limit] + 1) AS ahead) =
                      (SELECT count(*) AS count_2
                       FROM candidates)
                    AND NOT (EXISTS
                               (SELECT 1
                                FROM
                                  (SELECT DISTINCT candidates.staged_at AS staged_at
                                   FROM candidates) AS candidate_transactions
                                WHERE
                                    (SELECT 1
                                     FROM outbox AS charged_in_transaction
                                     WHERE charged_in_transaction.staged_at = candidate_transactions.staged_at
                                       AND charged_in_transaction.attempts > 0
                                       AND (charged_in_transaction.dead_at IS NOT NULL
                                            OR charged_in_transaction.retry_at > now())
                                       AND charged_in_transaction.published_at IS NULL
                                       AND charged_in_transaction.run_at <= now()
                                       AND charged_in_transaction.claimed_by IS DISTINCT
                                       FROM %(done)s::VARCHAR
                                       AND (EXISTS
                                              (SELECT 1
                                               FROM candidates AS later_candidate
                                               WHERE later_candidate.staged_at = charged_in_transaction.staged_at
                                                 AND later_candidate.id > charged_in_transaction.id))
                                     LIMIT 1) IS NOT NULL
                                  OR
                                    (SELECT 1
                                     FROM outbox AS parked_in_transaction
                                     WHERE parked_in_transaction.staged_at = candidate_transactions.staged_at
                                       AND parked_in_transaction.parked
                                       AND parked_in_transaction.published_at IS NULL
                                       AND parked_in_transaction.run_at <= now()
                                       AND parked_in_transaction.claimed_by IS DISTINCT
                                       FROM %(done)s::VARCHAR
                                       AND (EXISTS
                                              (SELECT 1
                                               FROM candidates AS later_candidate
                                               WHERE later_candidate.staged_at = parked_in_transaction.staged_at
                                                 AND later_candidate.id > parked_in_transaction.id))
                                     LIMIT 1) IS NOT NULL))) THEN EXISTS
                     (SELECT 1
                      FROM candidates AS probed_1
                      WHERE probed_1.ordering_key IS NOT NULL
                        AND ((
                                (SELECT ordering_key_head.id
                                 FROM outbox AS ordering_key_head
                                 WHERE ordering_key_head.ordering_key = probed_1.ordering_key
                                   AND ordering_key_head.published_at IS NULL
                                   AND ordering_key_head.run_at <= now()
                                   AND ordering_key_head.claimed_by IS DISTINCT
                                   FROM %(done)s::VARCHAR
                                 ORDER BY ordering_key_head.staged_at,
                                          ordering_key_head.id
                                 LIMIT 1) NOT IN
                                (SELECT candidates.id
                                 FROM candidates))
                             OR (
                                   (SELECT ordering_key_next.id
                                    FROM outbox AS ordering_key_next
                                    WHERE ordering_key_next.ordering_key = probed_1.ordering_key
                                      AND ordering_key_next.staged_at >= probed_1.staged_at
                                      AND (ordering_key_next.staged_at > probed_1.staged_at
                                           OR ordering_key_next.id > probed_1.id)
                                      AND (ordering_key_next.staged_at,
                                           ordering_key_next.id) <=
                                        (SELECT candidates.staged_at,
                                                candidates.id
                                         FROM candidates
                                         ORDER BY candidates.staged_at DESC,
                                                  candidates.id DESC
                                         LIMIT 1)
                                      AND ordering_key_next.published_at IS NULL
                                      AND ordering_key_next.run_at <= now()
                                      AND ordering_key_next.claimed_by IS DISTINCT
                                      FROM %(done)s::VARCHAR
                                    ORDER BY ordering_key_next.staged_at,
                                             ordering_key_next.id
                                    LIMIT 1) NOT IN
                                   (SELECT candidates.id
                                    FROM candidates))))
              ELSE EXISTS
                     (SELECT 1
                      FROM candidates AS probed_2
                      WHERE (
                               (SELECT staged_at_head.id
                                FROM outbox AS staged_at_head
                                WHERE staged_at_head.staged_at = probed_2.staged_at
                                  AND staged_at_head.published_at IS NULL
                                  AND staged_at_head.run_at <= now()
                                  AND staged_at_head.claimed_by IS DISTINCT
                                  FROM %(done)s::VARCHAR
                                ORDER BY staged_at_head.staged_at,
                                         staged_at_head.id
                                LIMIT 1) NOT IN
                               (SELECT candidates.id
                                FROM candidates))
                        OR (
                              (SELECT staged_at_next.id
                               FROM outbox AS staged_at_next
                               WHERE staged_at_next.staged_at = probed_2.staged_at
                                 AND staged_at_next.id > probed_2.id
                                 AND (staged_at_next.staged_at,
                                      staged_at_next.id) <=
                                   (SELECT candidates.staged_at,
                                           candidates.id
                                    FROM candidates
                                    ORDER BY candidates.staged_at DESC,
                                             candidates.id DESC
                                    LIMIT 1)
                                 AND staged_at_next.published_at IS NULL
                                 AND staged_at_next.run_at <= now()
                                 AND staged_at_next.claimed_by IS DISTINCT
                                 FROM %(done)s::VARCHAR
                               ORDER BY staged_at_next.staged_at,
                                        staged_at_next.id
                               LIMIT 1) NOT IN
                              (SELECT candidates.id
                               FROM candidates))
                        OR (
                              (SELECT ordering_key_head.id
                               FROM outbox AS ordering_key_head
                               WHERE ordering_key_head.ordering_key = probed_2.ordering_key
                                 AND ordering_key_head.published_at IS NULL
                                 AND ordering_key_head.run_at <= now()
                                 AND ordering_key_head.claimed_by IS DISTINCT
                                 FROM %(done)s::VARCHAR
                               ORDER BY ordering_key_head.staged_at,
                                        ordering_key_head.id
                               LIMIT 1) NOT IN
                              (SELECT candidates.id
                               FROM candidates))
                        OR (
                              (SELECT ordering_key_next.id
                               FROM outbox AS ordering_key_next
                               WHERE ordering_key_next.ordering_key = probed_2.ordering_key
                                 AND ordering_key_next.staged_at >= probed_2.staged_at
                                 AND (ordering_key_next.staged_at > probed_2.staged_at
                                      OR ordering_key_next.id > probed_2.id)
                                 AND (ordering_key_next.staged_at,
                                      ordering_key_next.id) <=
                                   (SELECT candidates.staged_at,
                                           candidates.id
                                    FROM candidates
                                    ORDER BY candidates.staged_at DESC,
                                             candidates.id DESC
                                    LIMIT 1)
                                 AND ordering_key_next.published_at IS NULL
                                 AND ordering_key_next.run_at <= now()
                                 AND ordering_key_next.claimed_by IS DISTINCT
                                 FROM %(done)s::VARCHAR
                               ORDER BY ordering_key_next.staged_at,
                                        ordering_key_next.id
                               LIMIT 1) NOT IN
                              (SELECT candidates.id
                               FROM candidates)))
          END AS crowded),
     claimed AS
  (UPDATE outbox
   SET claimed_by=%(token)s::VARCHAR,
       claimed_at=now()
   WHERE outbox.id = ANY (array(
                                  (SELECT candidates.id
                                   FROM candidates
                                   WHERE NOT
                                       (SELECT gate.crowded
                                        FROM gate)))) RETURNING outbox.id,
                                                                outbox.job,
                                                                outbox.queue,
                                                                outbox.input,
                                                                outbox.idempotency_key,
                                                                outbox.max_attempts,
                                                                outbox.run_at,
                                                                outbox.staged_at,
                                                                outbox.tenant_id,
                                                                outbox.traceparent,
                                                                outbox.enqueued_by,
                                                                outbox.ordering_key,
                                                                outbox.attempts)
SELECT header.crowded,
       header.skip_to,
       claimed.id,
       claimed.job,
       claimed.queue,
       claimed.input,
       claimed.idempotency_key,
       claimed.max_attempts,
       claimed.run_at,
       claimed.staged_at,
       claimed.tenant_id,
       claimed.traceparent,
       claimed.enqueued_by,
       claimed.ordering_key,
       claimed.attempts
FROM
  (SELECT
     (SELECT gate.crowded
      FROM gate) AS crowded,
          CASE
              WHEN
                     (SELECT gate.crowded
                      FROM gate) THEN CASE
                                          WHEN (
                                                  (SELECT count(*) AS count_3
                                                   FROM
                                                     (SELECT 1
                                                      FROM outbox AS ahead
                                                      WHERE ahead.published_at IS NULL
                                                        AND ahead.run_at <= now()
                                                        AND ahead.claimed_by IS DISTINCT
                                                        FROM %(done)s::VARCHAR
                                                        AND ahead.dead_at IS NULL
                                                        AND NOT ahead.parked
                                                        AND (ahead.retry_at IS NULL
                                                             OR ahead.retry_at <= now())
                                                        AND ahead.staged_at >=
                                                          (SELECT %(after_staged_at)s::TIMESTAMP WITH TIME ZONE AS anon_5)
                                                        AND (ahead.staged_at >
                                                               (SELECT %(after_staged_at)s::TIMESTAMP WITH TIME ZONE AS anon_5)
                                                             OR ahead.id >
                                                               (SELECT %(after_id)s::UUID AS anon_6))
                                                        AND (ahead.staged_at,
                                                             ahead.id) <=
                                                          (SELECT candidates.staged_at,
                                                                  candidates.id
                                                           FROM candidates
                                                           ORDER BY candidates.staged_at DESC,
                                                                    candidates.id DESC
                                                           LIMIT 1)
                                                      ORDER BY ahead.staged_at,
                                                               ahead.id
                                                      LIMIT __[POSTCOMPILE_limit] + 1) AS ahead) !=
                                                  (SELECT count(*) AS count_4
                                                   FROM candidates)) THEN
                                                 (SELECT min(candidates.staged_at) AS min_1
                                                  FROM candidates)
                                      END
          END AS skip_to) AS header
LEFT OUTER JOIN claimed ON TRUE
ORDER BY claimed.staged_at,
         claimed.id
