SELECT outbox.id,

  (SELECT staged_at_head.id
   FROM outbox AS staged_at_head USE INDEX (ix_outbox_unpublished)
   WHERE staged_at_head.staged_at = outbox.staged_at
     AND staged_at_head.published_at IS NULL
     AND staged_at_head.run_at <= %s
     AND NOT (staged_at_head.claimed_by <=> %s)
   ORDER BY staged_at_head.staged_at,
            staged_at_head.id
   LIMIT 1) AS transaction_head,

  (SELECT ordering_key_head.id
   FROM outbox AS ordering_key_head USE INDEX (ix_outbox_key)
   WHERE ordering_key_head.ordering_key = outbox.ordering_key
     AND ordering_key_head.published_at IS NULL
     AND ordering_key_head.run_at <= %s
     AND NOT (ordering_key_head.claimed_by <=> %s)
   ORDER BY ordering_key_head.staged_at,
            ordering_key_head.id
   LIMIT 1) AS key_head,

  (SELECT staged_at_next.id
   FROM outbox AS staged_at_next USE INDEX (ix_outbox_unpublished)
   WHERE staged_at_next.staged_at = outbox.staged_at
     AND staged_at_next.id > outbox.id
     AND staged_at_next.published_at IS NULL
     AND staged_at_next.run_at <= %s
     AND NOT (staged_at_next.claimed_by <=> %s)
   ORDER BY staged_at_next.staged_at,
            staged_at_next.id
   LIMIT 1) AS transaction_successor,

  (SELECT ordering_key_next.id
   FROM outbox AS ordering_key_next USE INDEX (ix_outbox_key)
   WHERE ordering_key_next.ordering_key = outbox.ordering_key
     AND ordering_key_next.staged_at >= outbox.staged_at
     AND (ordering_key_next.staged_at > outbox.staged_at
          OR ordering_key_next.id > outbox.id)
     AND ordering_key_next.published_at IS NULL
     AND ordering_key_next.run_at <= %s
     AND NOT (ordering_key_next.claimed_by <=> %s)
   ORDER BY ordering_key_next.staged_at,
            ordering_key_next.id
   LIMIT 1) AS key_successor
FROM outbox
WHERE outbox.id IN (__[POSTCOMPILE_ids])
