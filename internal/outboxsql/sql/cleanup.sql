-- The cleanups delete, oldest first and at most $2 rows a statement, rows
-- older than $1 milliseconds, so each statement stays short.

-- CleanupDelivered trims the record of delivered ids, along its primary key.
{{define "CleanupDelivered"}}
DELETE FROM {{.Delivered}} WHERE (done_at, id) IN (
	SELECT done_at, id FROM {{.Delivered}} WHERE done_at < now() - $1 * interval '1 millisecond'
	ORDER BY done_at LIMIT $2)
{{end}}

-- CleanupBackfilled trims the backfill's record of moved ids.
{{define "CleanupBackfilled"}}
DELETE FROM {{.Backfilled}} WHERE message_id IN (
	SELECT message_id FROM {{.Backfilled}} WHERE moved_at < now() - $1 * interval '1 millisecond'
	ORDER BY moved_at LIMIT $2)
{{end}}
