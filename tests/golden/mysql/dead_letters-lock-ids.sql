SELECT outbox.id
FROM outbox
WHERE outbox.published_at IS NULL
  AND outbox.dead_at IS NOT NULL
  AND outbox.id IN (__[POSTCOMPILE_ids])
ORDER BY outbox.staged_at,
         outbox.id
FOR
UPDATE
