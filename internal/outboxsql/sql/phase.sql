-- The shared phase and the running relays (package phase; migration 00008).

-- PhaseRead: the table's phase, if one was ever set.
{{define "PhaseRead"}}SELECT phase, changed_at, changed_by, reason FROM {{.Phase}}{{end}}

-- PhaseLock: a change of phase holds this (keyed by the phase table's oid)
-- to its commit, so two changes run one after the other; relays reading the
-- phase do not wait for it.
{{define "PhaseLock"}}SELECT pg_advisory_xact_lock('{{.Phase}}'::regclass::oid::bigint){{end}}

-- PhaseShare: what decides on the phase and writes by it (Finish) holds
-- PhaseLock shared to its commit, so it runs wholly before or after a
-- change; false while a change holds it.
{{define "PhaseShare"}}SELECT pg_try_advisory_xact_lock_shared('{{.Phase}}'::regclass::oid::bigint){{end}}

-- PhaseSet: @phase, changed by @changed_by, for @reason, @forced or not; the change goes
-- into the history with the same time. The time is taken under PhaseLock, not
-- at the transaction's start: a period ends after every write made under
-- PhaseShare before the change.
{{define "PhaseSet"}}
WITH history AS (
	INSERT INTO {{.PhaseHistory}} (phase, changed_at, changed_by, reason, forced) VALUES (@phase, clock_timestamp(), @changed_by, @reason, @forced)
	RETURNING changed_at
)
INSERT INTO {{.Phase}} (phase, changed_at, changed_by, reason) SELECT @phase, changed_at, @changed_by, @reason FROM history
ON CONFLICT (singleton) DO UPDATE SET phase = excluded.phase, changed_at = excluded.changed_at,
	changed_by = excluded.changed_by, reason = excluded.reason
RETURNING changed_at
{{end}}

-- PhaseHistory: every change, oldest first.
{{define "PhaseHistory"}}SELECT phase, changed_at, changed_by, reason, forced FROM {{.PhaseHistory}} ORDER BY id{{end}}

-- InstancePresent: this session takes its presence lock, the instances
-- table's oid and its backend pid, which no other session has: the relay
-- is running while the session lives, with no row rewritten to say so
-- (under a held horizon each version would stay). A killed relay's row
-- whose pid this session reuses goes. False: another session holds it.
{{define "InstancePresent"}}
WITH reused AS (DELETE FROM {{.Instances}} WHERE pid = pg_backend_pid())
SELECT pg_try_advisory_lock('{{.Instances}}'::regclass::oid::int4, pg_backend_pid())
{{end}}

-- present: the relay of row i holds its presence lock.
{{define "present"}}EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid = i.pid
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = '{{.Instances}}'::regclass::oid AND l.objid = i.pid::oid AND l.objsubid = 2){{end}}

-- InstanceBeat: @instance, its @phase, @pinned or not, its @version and
-- when it @started_at, bound to this session, which holds InstancePresent.
{{define "InstanceBeat"}}
INSERT INTO {{.Instances}} (instance, phase, pinned, version, started_at, pid)
VALUES (@instance, @phase, @pinned, @version, @started_at, pg_backend_pid())
ON CONFLICT (instance) DO UPDATE SET phase = excluded.phase, pinned = excluded.pinned,
	version = excluded.version, started_at = excluded.started_at, pid = excluded.pid, seen_at = now()
{{end}}

-- InstanceLeave: @instance stopped.
{{define "InstanceLeave"}}DELETE FROM {{.Instances}} WHERE instance = @instance{{end}}

-- InstancesPrune: forget the relays that are not running and last wrote
-- their row @forget_after_ms milliseconds ago or more (killed ones).
{{define "InstancesPrune"}}
DELETE FROM {{.Instances}} i WHERE seen_at < now() - @forget_after_ms * interval '1 millisecond' AND NOT {{template "present" .}}
{{end}}

-- Instances: the running relays, and how long ago each was seen: those
-- holding their presence lock now, and those of an earlier version (no
-- pid) that wrote their row in the last @seen_ms milliseconds.
{{define "Instances"}}
SELECT instance, phase, pinned, version, started_at, seen, extract(epoch FROM now() - seen)
FROM (SELECT i.*, CASE WHEN i.pid IS NULL THEN i.seen_at ELSE now() END AS seen FROM {{.Instances}} i
	WHERE CASE WHEN i.pid IS NULL THEN i.seen_at >= now() - @seen_ms * interval '1 millisecond' ELSE {{template "present" .}} END) i
ORDER BY instance
{{end}}
