DELETE
FROM outbox
WHERE outbox.published_at IS NULL
  AND outbox.dead_at IS NOT NULL RETURNING outbox.id
