ANALYZE outbox
