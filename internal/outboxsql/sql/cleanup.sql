-- The cleanups delete, oldest first and at most @limit rows a statement,
-- rows older than @retention_ms milliseconds and not older than @from, so
-- each statement stays short, by their row addresses (a TID scan, whatever
-- the planner makes of the table); each returns how many it deleted and the
-- newest one's time (parameters: CleanupParams). @from is
-- where the last pass stopped, less a margin: while a long transaction holds
-- VACUUM's horizon, the rows deleted before stay in the index, and a walk
-- from the oldest would step over each of them on every pass.

-- CleanupDelivered trims the record of delivered ids, along its primary key.
{{define "CleanupDelivered"}}
WITH deleted AS (
	DELETE FROM {{.Delivered}} WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {{.Delivered}} WHERE done_at >= @from::timestamptz AND done_at < now() - @retention_ms * interval '1 millisecond'
		ORDER BY done_at LIMIT @limit))
	RETURNING done_at)
SELECT count(*), max(done_at) FROM deleted
{{end}}

-- CleanupBackfilled trims the backfill's record of moved ids.
{{define "CleanupBackfilled"}}
WITH deleted AS (
	DELETE FROM {{.Backfilled}} WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {{.Backfilled}} WHERE moved_at >= @from::timestamptz AND moved_at < now() - @retention_ms * interval '1 millisecond'
		ORDER BY moved_at LIMIT @limit))
	RETURNING moved_at)
SELECT count(*), max(moved_at) FROM deleted
{{end}}
