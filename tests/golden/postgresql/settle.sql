WITH marked AS
  (UPDATE outbox
   SET published_at=now()
   WHERE outbox.claimed_by = %(token)s::VARCHAR
     AND outbox.published_at IS NULL
     AND outbox.id = ANY (%(ids)s::UUID[]) RETURNING outbox.id),
     unparked AS
  (UPDATE outbox
   SET parked=FALSE,
              parked_behind=NULL
   WHERE
       (SELECT some_parked_behind.parked_behind
        FROM outbox AS some_parked_behind
        WHERE some_parked_behind.parked_behind IS NOT NULL
        LIMIT 1) IS NOT NULL
     AND outbox.parked_behind = ANY (array(
                                             (SELECT marked.id
                                              FROM marked))) RETURNING outbox.id),
     behind AS
  (SELECT later.id AS id,
          coalesce(handed.behind, handed.id) AS behind
   FROM unnest(CAST(
                      (SELECT %(handed_ids)s::UUID[] AS anon_1) AS UUID[]), CAST(
                                                                                   (SELECT %(errors)s::TEXT[] AS anon_2) AS TEXT[]), CAST(
                                                                                                                                            (SELECT %(delays)s::INTERVAL[] AS anon_3) AS INTERVAL[]), CAST(
                                                                                                                                                                                                             (SELECT %(deads)s::BOOLEAN[] AS anon_4) AS BOOLEAN[]), CAST(
                                                                                                                                                                                                                                                                           (SELECT %(parks)s::BOOLEAN[] AS anon_5) AS BOOLEAN[]), CAST(
                                                                                                                                                                                                                                                                                                                                         (SELECT %(behinds)s::UUID[] AS anon_6) AS UUID[])) AS handed(id, error, delay, dead, park, behind)
   JOIN outbox AS stuck_row ON stuck_row.id = handed.id
   JOIN LATERAL
     (SELECT later_row.id AS id
      FROM outbox AS later_row
      WHERE later_row.staged_at = stuck_row.staged_at
        AND later_row.id > stuck_row.id
        AND later_row.published_at IS NULL
        AND later_row.claimed_by IS NULL
        AND later_row.dead_at IS NULL
        AND NOT later_row.parked
      LIMIT ALL
      OFFSET 0
      FOR UPDATE SKIP LOCKED) AS later ON TRUE
   WHERE (handed.error IS NOT NULL
          OR handed.park)
     AND stuck_row.claimed_by = %(token)s::VARCHAR
     AND stuck_row.published_at IS NULL),
     written AS
  (UPDATE outbox
   SET claimed_by=NULL,
       claimed_at=NULL,
       attempts=(outbox.attempts + CASE
                                       WHEN (target.error IS NOT NULL) THEN %(param_1)s::INTEGER
                                       ELSE %(param_2)s::INTEGER
                                   END),
       last_error=coalesce(target.error, outbox.last_error),
       retry_at=CASE
                    WHEN (target.error IS NULL) THEN outbox.retry_at
                    WHEN target.dead THEN NULL
                    ELSE now() + target.delay
                END,
                dead_at=CASE
                            WHEN (target.error IS NULL) THEN outbox.dead_at
                            WHEN target.dead THEN now()
                            ELSE NULL
                        END,
                        parked=target.park,
                        parked_behind=CASE
                                          WHEN target.park THEN target.behind
                                          ELSE NULL
                                      END
   FROM
     (SELECT handed.id AS id,
             handed.error AS error,
             handed.delay AS delay,
             handed.dead AS dead,
             handed.park AS park,
             handed.behind AS behind,
             %(token)s::VARCHAR AS fence
      FROM unnest(CAST(
                         (SELECT %(handed_ids)s::UUID[] AS anon_1) AS UUID[]), CAST(
                                                                                      (SELECT %(errors)s::TEXT[] AS anon_2) AS TEXT[]), CAST(
                                                                                                                                               (SELECT %(delays)s::INTERVAL[] AS anon_3) AS INTERVAL[]), CAST(
                                                                                                                                                                                                                (SELECT %(deads)s::BOOLEAN[] AS anon_4) AS BOOLEAN[]), CAST(
                                                                                                                                                                                                                                                                              (SELECT %(parks)s::BOOLEAN[] AS anon_5) AS BOOLEAN[]), CAST(
                                                                                                                                                                                                                                                                                                                                            (SELECT %(behinds)s::UUID[] AS anon_6) AS UUID[])) AS handed(id, error, delay, dead, park, behind)
      UNION ALL SELECT behind.id AS id,
                       NULL AS error,
                       NULL AS delay,
                       NULL AS dead,
                       TRUE AS park,
                               behind.behind AS behind,
                               NULL AS fence
      FROM behind) AS target
   WHERE outbox.id = target.id
     AND outbox.published_at IS NULL
     AND outbox.claimed_by IS NOT DISTINCT
     FROM target.fence RETURNING target.error IS NOT NULL AS charged,
                                                             target.park,
                                                             target.fence IS NULL AS behind)
SELECT
  (SELECT count(*) AS count_1
   FROM marked) AS marked,

  (SELECT count(*) AS count_2
   FROM unparked) AS unparked,

  (SELECT count(*) AS count_3
   FROM written
   WHERE written.charged) AS charged,

  (SELECT count(*) AS count_4
   FROM written
   WHERE NOT written.charged
     AND NOT written.park) AS released,

  (SELECT count(*) AS count_5
   FROM written
   WHERE written.park
     AND NOT written.behind) AS held_back,

  (SELECT count(*) AS count_6
   FROM written
   WHERE written.behind) AS parked_behind
