DELETE
FROM outbox USING outbox,

  (SELECT outbox.id AS id
   FROM outbox
   WHERE outbox.published_at < %s
   ORDER BY outbox.published_at
   LIMIT %s) AS oldest
WHERE outbox.id = oldest.id
