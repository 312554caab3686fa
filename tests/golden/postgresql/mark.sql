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
                                              FROM marked))) RETURNING outbox.id)
SELECT
  (SELECT count(*) AS count_1
   FROM marked) AS marked,

  (SELECT count(*) AS count_2
   FROM unparked) AS unparked
