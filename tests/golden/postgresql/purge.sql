DELETE
FROM outbox
WHERE outbox.id = ANY (array(
                               (SELECT outbox.id
                                FROM outbox
                                WHERE outbox.published_at < %(cutoff)s::TIMESTAMP WITH TIME ZONE
                                ORDER BY outbox.published_at
                                LIMIT %(limit)s
                                FOR UPDATE SKIP LOCKED)))
