-- The cleanups delete, oldest first and at most $2 rows a statement, rows
-- older than $1 milliseconds and not older than $3, so each statement stays
-- short, by their row addresses (a TID scan, whatever the planner makes of
-- the table); each returns how many it deleted and the newest one's time. $3 is
-- where the last pass stopped, less a margin: while a long transaction holds
-- VACUUM's horizon, the rows deleted before stay in the index, and a walk
-- from the oldest would step over each of them on every pass.

-- CleanupDelivered trims the record of delivered ids, along its primary key.
{{define "CleanupDelivered"}}
WITH d AS (
	DELETE FROM {{.Delivered}} WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {{.Delivered}} WHERE done_at >= $3::timestamptz AND done_at < now() - $1 * interval '1 millisecond'
		ORDER BY done_at LIMIT $2))
	RETURNING done_at)
SELECT count(*), max(done_at) FROM d
{{end}}

-- CleanupBackfilled trims the backfill's record of moved ids.
{{define "CleanupBackfilled"}}
WITH d AS (
	DELETE FROM {{.Backfilled}} WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {{.Backfilled}} WHERE moved_at >= $3::timestamptz AND moved_at < now() - $1 * interval '1 millisecond'
		ORDER BY moved_at LIMIT $2))
	RETURNING moved_at)
SELECT count(*), max(moved_at) FROM d
{{end}}
