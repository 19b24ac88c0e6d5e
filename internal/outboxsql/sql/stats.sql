-- The backlog figures (relay.ReadStats, relay.ActiveTargets, the cutover
-- check). Each reads through the target's partial indexes, so its cost does
-- not grow with the backlog beyond .ExactLimit index entries.

-- pendingFirst: the first .N rows owed to the target in id order, with
-- columns .Cols (.Fresh for the outbox's, which has no delivery state): a
-- merge of the owed table's two pending indexes (unkeyed and keyed rows are
-- indexed apart, for the claims) above @owed_floor and @owed_keyed_floor,
-- and the outbox's primary key from @floor (a relay's floors: below them
-- the tables hold only rows a long transaction keeps on disk, deleted; 0
-- for all).
{{define "pendingFirst"}}(SELECT * FROM (
		(SELECT {{.Cols}} FROM {{.Owed}} WHERE key IS NULL AND {{template "owed" .}} AND id > @owed_floor::bigint ORDER BY id LIMIT {{.N}})
		UNION ALL
		(SELECT {{.Cols}} FROM {{.Owed}} WHERE key IS NOT NULL AND {{template "owed" .}} AND id > @owed_keyed_floor::bigint ORDER BY id LIMIT {{.N}})
		UNION ALL
		(SELECT {{.Fresh}} FROM {{.Table}} WHERE id >= @floor::bigint ORDER BY id LIMIT {{.N}})
	) u ORDER BY id LIMIT {{.N}}){{end}}

-- pendingLast: the highest id owed to the target (NULL if none). Each table
-- is read down to its floor at most: when every row above is deleted, a
-- held horizon keeps them all on disk, and the walk would visit each.
{{define "pendingLast"}}greatest(
		(SELECT id FROM {{.Owed}} WHERE key IS NULL AND {{template "owed" .}} AND id > @owed_floor::bigint ORDER BY id DESC LIMIT 1),
		(SELECT id FROM {{.Owed}} WHERE key IS NOT NULL AND {{template "owed" .}} AND id > @owed_keyed_floor::bigint ORDER BY id DESC LIMIT 1),
		(SELECT id FROM {{.Table}} WHERE id >= @floor::bigint ORDER BY id DESC LIMIT 1)){{end}}

-- StatsPending: the pending window and its retries, the id range for the
-- estimate past it, and the oldest of the first 100 pending rows (the lag).
{{define "StatsPending"}}
WITH head AS {{template "pendingFirst" (.First "id, topic, created_at" "id, topic, created_at" 100)}}, first AS (
	SELECT id, topic, created_at FROM head ORDER BY created_at, id LIMIT 1
), pending_window AS {{template "pendingFirst" (.First (print "id, " .P "_retry_at AS retry_at") "id, NULL::timestamptz" .ExactLimit)}}
SELECT clock_timestamp(),
	(SELECT count(*) FROM pending_window),
	(SELECT count(*) FROM pending_window WHERE retry_at > now()),
	(SELECT min(id) FROM pending_window),
	{{template "pendingLast" .}},
	first.id, first.topic, first.created_at,
	extract(epoch FROM clock_timestamp() - first.created_at)::float8
FROM (SELECT 1) one LEFT JOIN first ON true
{{end}}

-- StatsParked: the rows parked for the target and the keys they hold.
{{define "StatsParked"}}
SELECT count(*), count(DISTINCT key) FROM {{.Owed}}
		WHERE {{template "parked" .}}
{{end}}

-- StatsLastError: the last error of the newest unfinished row that has one,
-- pending (of the window) or parked.
{{define "StatsLastError"}}
SELECT last_error FROM (
		(SELECT id, last_error FROM {{template "pendingFirst" (.First (print "id, " .P "_last_error AS last_error") "id, NULL::text" .ExactLimit)}} f)
		UNION ALL
		(SELECT id, {{.P}}_last_error FROM {{.Owed}} WHERE {{template "parked" .}})
	) r WHERE last_error IS NOT NULL ORDER BY id DESC LIMIT 1
{{end}}

-- FinishedWithoutNATS counts the rows that left the outbox without JetStream
-- in the last @lookback (an interval), after the first that reached it there; it
-- walks the delivered table's primary key (done_at first).
{{define "FinishedWithoutNATS"}}
WITH first_nats AS (
	SELECT min(done_at) AS first FROM {{.Delivered}} WHERE done_at > now() - @lookback::interval AND nats_delivered_at IS NOT NULL)
SELECT count(*), now(), (SELECT first FROM first_nats) FROM {{.Delivered}}
WHERE done_at > now() - @lookback::interval AND nats_delivered_at IS NULL
  AND done_at > coalesce((SELECT first FROM first_nats), '-infinity')
{{end}}

-- FinishedWithoutNATSSince counts such rows since @since (a timestamp).
{{define "FinishedWithoutNATSSince"}}
SELECT count(*), now() FROM {{.Delivered}}
WHERE done_at > @since AND nats_delivered_at IS NULL
{{end}}

-- ActiveTargets: per target, whether a row was delivered to it, tried for
-- it or parked for it, in the owed table's oldest .ActiveWindow rows, the newest
-- of the delivered table, or parked anywhere.
{{define "ActiveTargets"}}
WITH head AS (SELECT amqp_delivered_at, amqp_attempts, nats_delivered_at, nats_attempts FROM {{.Owed}} ORDER BY id LIMIT {{.ActiveWindow}}),
recent AS (SELECT amqp_delivered_at, nats_delivered_at FROM {{.Delivered}} ORDER BY done_at DESC LIMIT {{.ActiveWindow}})
SELECT
	{{template "served" .AMQP}},
	{{template "served" .NATS}}
{{end}}

{{define "served"}}EXISTS (SELECT 1 FROM head WHERE {{.P}}_delivered_at IS NOT NULL OR {{.P}}_attempts > 0)
	OR EXISTS (SELECT 1 FROM recent WHERE {{.P}}_delivered_at IS NOT NULL)
	OR EXISTS (SELECT 1 FROM {{.Owed}} WHERE {{template "parked" .}}){{end}}
