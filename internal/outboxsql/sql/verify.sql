-- VerifyOutbox: the (message id, delivered at) pairs delivered to JetStream
-- between $1 and $2, an id once. Rows delivered to every target are in the
-- delivered table, the rest in the owed table; done_at >= nats_delivered_at, so
-- the delivered table's walk starts on its done_at index.
{{define "VerifyOutbox"}}
SELECT DISTINCT ON (msg_id) msg_id, at FROM (
	SELECT message_id::text AS msg_id, nats_delivered_at AS at FROM {{.Owed}}
	WHERE nats_delivered_at >= $1 AND nats_delivered_at <= $2
	UNION ALL
	SELECT message_id::text, nats_delivered_at FROM {{.Delivered}}
	WHERE done_at >= $1 AND nats_delivered_at >= $1 AND nats_delivered_at <= $2
) w ORDER BY msg_id, at
{{end}}

-- VerifyBackfill: the (message id, moved at) pairs the backfill moved
-- between $1 and $2.
{{define "VerifyBackfill"}}
SELECT message_id, moved_at FROM {{.Backfilled}}
WHERE moved_at >= $1 AND moved_at <= $2
{{end}}
