-- Record writes a batch's outcomes in one statement: rows still owed are
-- updated in the owed table, or moved there from the outbox, with the route
-- they went by (an owed row keeps the one it has); rows every enabled
-- target has move to the delivered table. $1..$7: id, then per target
-- outcome (0 none, 1 delivered, 2 retry, 3 parked, 4 outage: retry, not an
-- attempt), error, backoff in ms; $8..$10: id, then per target whether this
-- batch delivered it; $11..$14 the route of $1's rows: exchange, routing
-- key, subject, stream.
{{define "Record"}}
WITH u AS (
	SELECT * FROM unnest($1::bigint[], $2::smallint[], $3::text[], $4::bigint[], $5::smallint[], $6::text[], $7::bigint[],
		$11::text[], $12::text[], $13::text[], $14::text[])
		AS u(id, a, ae, ab, n, ne, nb, r_exchange, r_key, r_subject, r_stream)
), upd AS (
	UPDATE {{.Owed}} o SET ({{template "stateColumns"}}, {{template "routeColumns"}}) = ({{template "stateAfter"}},
		{{template "routeAfter"}})
	FROM u WHERE o.id = u.id
), mv AS (
	DELETE FROM {{.Table}} f USING u WHERE f.id = u.id
	RETURNING {{template "freshRow" "f"}}
), moved AS (
	INSERT INTO {{.Owed}} ({{template "freshRow" ""}}, {{template "stateColumns"}}, {{template "routeColumns"}})
	SELECT {{template "freshRow" "f"}}, {{template "stateAfter"}}, {{template "routeAfter"}}
	FROM mv f JOIN u ON u.id = f.id CROSS JOIN LATERAL (SELECT {{template "freshState"}}) o
), d AS (
	SELECT * FROM unnest($8::bigint[], $9::boolean[], $10::boolean[]) AS d(id, a, n)
), del AS (
	DELETE FROM {{.Owed}} o USING d WHERE o.id = d.id
	RETURNING o.message_id, o.id,
		CASE WHEN d.a THEN clock_timestamp() ELSE o.amqp_delivered_at END AS amqp_at,
		CASE WHEN d.n THEN clock_timestamp() ELSE o.nats_delivered_at END AS nats_at,
		d.a OR {{template "amqpSent"}} AS amqp_sent
), del_fresh AS (
	DELETE FROM {{.Table}} f USING d WHERE f.id = d.id
	RETURNING f.message_id, f.id,
		CASE WHEN d.a THEN clock_timestamp() END AS amqp_at,
		CASE WHEN d.n THEN clock_timestamp() END AS nats_at,
		d.a AS amqp_sent
)
{{template "intoDelivered" .}}
SELECT id, message_id, amqp_at, nats_at, amqp_sent, clock_timestamp() FROM (SELECT * FROM del UNION ALL SELECT * FROM del_fresh) f
{{end}}

-- stateColumns, stateAfter: a row's delivery state, and what batch outcome
-- u makes of o's.
{{define "stateColumns"}}amqp_delivered_at, amqp_attempts, amqp_retry_at, amqp_parked_at, amqp_last_error,
		nats_delivered_at, nats_attempts, nats_retry_at, nats_parked_at, nats_last_error{{end}}
{{define "stateAfter"}}
		CASE WHEN u.a = 1 THEN clock_timestamp() ELSE o.amqp_delivered_at END,
		o.amqp_attempts + (u.a IN (1, 2, 3))::int,
		CASE WHEN u.a IN (2, 4) THEN clock_timestamp() + u.ab * interval '1 millisecond' WHEN u.a = 1 THEN NULL ELSE o.amqp_retry_at END,
		CASE WHEN u.a = 3 THEN clock_timestamp() ELSE o.amqp_parked_at END,
		CASE WHEN u.a IN (2, 3, 4) THEN u.ae ELSE o.amqp_last_error END,
		CASE WHEN u.n = 1 THEN clock_timestamp() ELSE o.nats_delivered_at END,
		o.nats_attempts + (u.n IN (1, 2, 3))::int,
		CASE WHEN u.n IN (2, 4) THEN clock_timestamp() + u.nb * interval '1 millisecond' WHEN u.n = 1 THEN NULL ELSE o.nats_retry_at END,
		CASE WHEN u.n = 3 THEN clock_timestamp() ELSE o.nats_parked_at END,
		CASE WHEN u.n IN (2, 3, 4) THEN u.ne ELSE o.nats_last_error END{{end}}

-- routeColumns, routeAfter: a row's route, and what batch outcome u makes
-- of o's: the route recorded first stays (a NULL subject: none yet).
{{define "routeColumns"}}amqp_exchange, amqp_routing_key, nats_subject, nats_stream{{end}}
{{define "routeAfter"}}
		CASE WHEN o.nats_subject IS NULL THEN u.r_exchange ELSE o.amqp_exchange END,
		CASE WHEN o.nats_subject IS NULL THEN u.r_key ELSE o.amqp_routing_key END,
		CASE WHEN o.nats_subject IS NULL THEN u.r_subject ELSE o.nats_subject END,
		CASE WHEN o.nats_subject IS NULL THEN u.r_stream ELSE o.nats_stream END{{end}}

-- freshState: the delivery state of a fresh row, as the owed table's defaults.
{{define "freshState"}}NULL::timestamptz AS amqp_delivered_at, 0 AS amqp_attempts, NULL::timestamptz AS amqp_retry_at,
		NULL::timestamptz AS amqp_parked_at, NULL::text AS amqp_last_error,
		NULL::timestamptz AS nats_delivered_at, 0 AS nats_attempts, NULL::timestamptz AS nats_retry_at,
		NULL::timestamptz AS nats_parked_at, NULL::text AS nats_last_error,
		NULL::text AS amqp_exchange, NULL::text AS amqp_routing_key, NULL::text AS nats_subject, NULL::text AS nats_stream{{end}}

-- freshRow: the producers' columns, of the row alias given ("" for none).
{{define "freshRow"}}{{with .}}{{.}}.{{end}}id, {{with .}}{{.}}.{{end}}message_id, {{with .}}{{.}}.{{end}}topic, {{with .}}{{.}}.{{end}}key, {{with .}}{{.}}.{{end}}headers, {{with .}}{{.}}.{{end}}payload, {{with .}}{{.}}.{{end}}created_at{{end}}

-- LateWait locks the outbox's rows of message ids $1, waiting for a batch
-- that holds them to end: Late, the next statement, then sees what it
-- recorded (a row it left owed is in the owed table by then).
{{define "LateWait"}}SELECT count(*) FROM (SELECT id FROM {{.Table}} WHERE message_id = ANY ($1::uuid[]) ORDER BY id FOR UPDATE) l{{end}}

-- Late marks the rows of message ids $1 delivered to the target, whose
-- confirm came after their batch gave up, and returns each row's id and
-- whether each target has it now: an owed row is updated (and unparked), a
-- row its batch left in the outbox moves to the owed table, and its topic
-- and headers come back too, for LateRoute. Each table's
-- rows are locked in id order, outbox first, so two instances recording
-- overlapping sets wait instead of deadlocking.
{{define "Late"}}
WITH mv AS (
	DELETE FROM {{.Table}} f WHERE f.id IN (SELECT id FROM {{.Table}} WHERE message_id = ANY ($1::uuid[]) ORDER BY id FOR UPDATE)
	RETURNING {{template "freshRow" "f"}}
), moved AS (
	INSERT INTO {{.Owed}} ({{template "freshRow" ""}}, {{.P}}_delivered_at)
	SELECT {{template "freshRow" "f"}}, clock_timestamp() FROM mv f
	RETURNING id, amqp_delivered_at IS NOT NULL, nats_delivered_at IS NOT NULL, topic, headers::text
), upd AS (
	UPDATE {{.Owed}} o SET {{.P}}_delivered_at = clock_timestamp(), {{.P}}_retry_at = NULL, {{.P}}_parked_at = NULL, {{.P}}_last_error = NULL
	FROM (SELECT id FROM {{.Owed}} WHERE message_id = ANY ($1::uuid[]) AND {{.P}}_delivered_at IS NULL AND done_at IS NULL ORDER BY id FOR UPDATE) l
	WHERE o.id = l.id
	RETURNING o.id, o.amqp_delivered_at IS NOT NULL, o.nats_delivered_at IS NOT NULL, NULL::text, NULL::text
)
SELECT * FROM moved UNION ALL SELECT * FROM upd
{{end}}

-- LateRoute records the route of rows Late moved, as the relay that
-- published them resolved it: $1 ids, $2..$5 exchange, routing key,
-- subject, stream. A row routed already keeps its route.
{{define "LateRoute"}}
UPDATE {{.Owed}} o SET ({{template "routeColumns"}}) = (u.r_exchange, u.r_key, u.r_subject, u.r_stream)
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, r_exchange, r_key, r_subject, r_stream)
WHERE o.id = u.id AND o.nats_subject IS NULL
{{end}}

-- Finish moves the rows JetStream has (the nats-only phase) out of the next
-- slice of the owed table in id order, past $1, at most $2 rows: the primary
-- key's order, never a scan of the whole backlog. It returns the slice's
-- last id, its rows, and the rows moved. It moves nothing once the table's
-- phase is set to another: a relay that has not read the change yet would
-- finish rows the relays in dual write still send RabbitMQ. It runs after
-- PhaseShare, in its transaction, so its snapshot sees every change before
-- it and no change commits until it has.
{{define "Finish"}}
WITH slice AS MATERIALIZED (
	SELECT id FROM {{.Owed}} WHERE id > $1 ORDER BY id LIMIT $2
), del AS (
	DELETE FROM {{.Owed}} o WHERE o.id IN (
		SELECT id FROM {{.Owed}} WHERE id IN (SELECT id FROM slice) AND nats_delivered_at IS NOT NULL AND done_at IS NULL
		  AND NOT EXISTS (SELECT 1 FROM {{.Phase}} WHERE phase <> 'nats')
		FOR UPDATE SKIP LOCKED)
	RETURNING o.message_id, o.id, o.amqp_delivered_at, o.nats_delivered_at,
		{{template "amqpSent"}} AS amqp_sent
), ins AS (
	{{template "intoDelivered" .}}
	SELECT id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, clock_timestamp() FROM del
)
SELECT coalesce((SELECT max(id) FROM slice), 0), (SELECT count(*) FROM slice), (SELECT count(*) FROM del)
{{end}}
