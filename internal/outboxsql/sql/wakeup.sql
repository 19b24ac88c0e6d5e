-- MaxID: the outbox's highest id above @above (the relay's last claim's
-- top), 0 if none, read by a relay taking the wake lock to see whether rows
-- committed since its last claim. The bound stops the backward walk there:
-- while a long transaction keeps the rows deleted since on disk, a walk to
-- the newest live row would step over all of them.
{{define "MaxID"}}SELECT coalesce(max(id), 0) FROM {{.Table}} WHERE id > @above::bigint{{end}}

-- WakeLockState: MaxID, and whether a session holds the wake lock
-- (@lock_class, @lock_object: its key's halves) exclusively: a relay, which
-- producers notify, rather than producers alone, who hold it shared.
{{define "WakeLockState"}}SELECT ({{template "MaxID" .}}), EXISTS (
	SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	  AND classid = @lock_class::bigint::oid AND objid = @lock_object::bigint::oid AND objsubid = 1){{end}}
