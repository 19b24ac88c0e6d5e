-- What holds back VACUUM's horizon for relayd's tables, and what it costs
-- them (relay.ReadPostgres: the metrics and relayd status). Catalog views
-- only: nothing here reads an outbox row.

-- Horizon: per kind, the holder whose horizon is the oldest: a transaction
-- that writes (it has a transaction id), the snapshot of one that only reads
-- (pg_dump, a long query), a standby's feedback (its walsender), a prepared
-- transaction, a replication slot. For each: its pid (NULL but for
-- sessions), a name (application name, backend type, gid or slot), its state,
-- the horizon's transaction id and its age in ids (readable without
-- privileges), and how long it has run in seconds (NULL where Postgres does
-- not say: another user's session without pg_read_all_stats, a standby, a
-- slot). Relayd's own session is left out.
{{define "Horizon"}}
WITH holders AS (
	SELECT CASE WHEN backend_type = 'walsender' THEN 'standby' WHEN backend_xid IS NOT NULL THEN 'transaction' ELSE 'snapshot' END AS kind,
		pid, coalesce(nullif(application_name, ''), backend_type) AS name, coalesce(state, '') AS state,
		CASE WHEN backend_xid IS NOT NULL AND (backend_xmin IS NULL OR age(backend_xid) >= age(backend_xmin)) THEN backend_xid ELSE backend_xmin END AS horizon,
		CASE WHEN backend_type = 'walsender' THEN NULL ELSE extract(epoch FROM clock_timestamp() - xact_start)::float8 END AS seconds
	FROM pg_stat_activity
	WHERE pid <> pg_backend_pid() AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
	  AND (datname = current_database() OR backend_type = 'walsender')
	UNION ALL
	SELECT 'prepared', NULL, gid, 'prepared', transaction, extract(epoch FROM clock_timestamp() - prepared)::float8
	FROM pg_prepared_xacts WHERE database = current_database()
	UNION ALL
	SELECT 'replication slot', NULL, slot_name, CASE WHEN active THEN 'active' ELSE 'inactive' END, xmin, NULL
	FROM pg_replication_slots WHERE xmin IS NOT NULL
)
SELECT DISTINCT ON (kind) kind, pid, name, state, horizon::text, age(horizon)::bigint, seconds
FROM holders ORDER BY kind, age(horizon) DESC, seconds DESC NULLS LAST
{{end}}

-- TableHealth: relayd's three tables by their role: dead and live row
-- versions (the statistics collector's estimates) and size on disk with
-- indexes and TOAST.
{{define "TableHealth"}}
SELECT t.role, coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0), pg_total_relation_size(t.oid)
FROM (VALUES ('outbox', '{{.Table}}'::regclass, 1), ('owed', '{{.Owed}}'::regclass, 2), ('delivered', '{{.Delivered}}'::regclass, 3)) t(role, oid, n)
LEFT JOIN pg_stat_user_tables s ON s.relid = t.oid
ORDER BY t.n
{{end}}
