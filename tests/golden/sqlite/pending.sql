SELECT count(*) AS count_1
FROM outbox
WHERE outbox.published_at IS NULL
