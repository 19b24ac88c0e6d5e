-- Known: of message ids @uuids (uuids, as text: pgx has no binary
-- encoding of a Go string as a uuid) and @ids (every id, as text), those
-- JetStream has or will get without the backfill: in the outbox (owed to
-- every target), in the owed table delivered to JetStream or owed to it, in
-- the delivered table (only rows RabbitMQ had: the amqp_sent index), or
-- moved by an earlier run.
{{define "Known"}}
SELECT message_id::text FROM {{.Table}} WHERE message_id = ANY(@uuids::text[]::uuid[])
UNION ALL
SELECT message_id::text FROM {{.Owed}}
WHERE message_id = ANY(@uuids::text[]::uuid[])
  AND (nats_delivered_at IS NOT NULL OR (done_at IS NULL AND nats_parked_at IS NULL))
UNION ALL
SELECT message_id::text FROM {{.Delivered}} WHERE message_id = ANY(@uuids::text[]::uuid[]) AND nats_delivered_at IS NOT NULL AND amqp_sent
UNION ALL
SELECT message_id FROM {{.Backfilled}} WHERE message_id = ANY(@ids::text[])
{{end}}

-- RecordMoved records the ids @ids the backfill moved from queue @queue
-- (@derived: whether each id was derived), so a rerun skips them.
{{define "RecordMoved"}}
INSERT INTO {{.Backfilled}} (message_id, queue, derived)
SELECT id, @queue, d FROM unnest(@ids::text[], @derived::boolean[]) AS u(id, d)
ON CONFLICT (message_id) DO NOTHING
{{end}}

-- BackfillMoved: per queue, the ids moved in the last @window_ms
-- milliseconds, and the first and last move among them (the moved_at
-- index): a running backfill's pace.
{{define "BackfillMoved"}}
SELECT queue, count(*), min(moved_at), max(moved_at) FROM {{.Backfilled}}
WHERE moved_at >= now() - @window_ms * interval '1 millisecond'
GROUP BY queue ORDER BY queue
{{end}}
