DELETE
FROM outbox
WHERE outbox.id IN
    (SELECT outbox.id
     FROM outbox
     WHERE outbox.published_at < ?
     ORDER BY outbox.published_at
     LIMIT ?
     OFFSET ?)
