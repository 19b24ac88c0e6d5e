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

-- InstanceBeat: @instance, its @phase, @pinned or not, its @version and
-- when it @started_at; the database's clock says when it was seen.
{{define "InstanceBeat"}}
INSERT INTO {{.Instances}} (instance, phase, pinned, version, started_at) VALUES (@instance, @phase, @pinned, @version, @started_at)
ON CONFLICT (instance) DO UPDATE SET phase = excluded.phase, pinned = excluded.pinned,
	version = excluded.version, started_at = excluded.started_at, seen_at = now()
{{end}}

-- InstanceLeave: @instance stopped.
{{define "InstanceLeave"}}DELETE FROM {{.Instances}} WHERE instance = @instance{{end}}

-- InstancesPrune: forget relays not seen for @forget_after_ms milliseconds (killed ones).
{{define "InstancesPrune"}}DELETE FROM {{.Instances}} WHERE seen_at < now() - @forget_after_ms * interval '1 millisecond'{{end}}

-- Instances: the relays seen in the last @seen_ms milliseconds, and how long ago.
{{define "Instances"}}
SELECT instance, phase, pinned, version, started_at, seen_at, extract(epoch FROM now() - seen_at)
FROM {{.Instances}} WHERE seen_at >= now() - @seen_ms * interval '1 millisecond' ORDER BY instance
{{end}}
