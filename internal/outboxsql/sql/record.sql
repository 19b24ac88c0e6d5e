-- Record writes a batch's outcomes in one statement: rows still owed are
-- updated in the owed table, or moved there from the outbox, with the route
-- they went by (an owed row keeps the one it has); rows every enabled
-- target has move to the delivered table. Parameters: RecordParams: per row
-- still owed its id, per target its outcome (an Outcome: .Outcome's
-- fields here), error and backoff, and its route; per row done its id and
-- whether this batch delivered it to each target.
{{define "Record"}}
WITH still_owed AS (
	SELECT * FROM unnest(@ids::bigint[], @amqp_outcomes::smallint[], @amqp_errors::text[], @amqp_backoffs_ms::bigint[],
		@nats_outcomes::smallint[], @nats_errors::text[], @nats_backoffs_ms::bigint[],
		@route_exchanges::text[], @route_routing_keys::text[], @route_subjects::text[], @route_streams::text[])
		AS u(id, amqp_outcome, amqp_error, amqp_backoff_ms, nats_outcome, nats_error, nats_backoff_ms, r_exchange, r_key, r_subject, r_stream)
), upd AS (
	UPDATE {{.Owed}} o SET ({{template "stateColumns"}}, {{template "routeColumns"}}) = ({{template "stateAfter" .}},
		{{template "routeAfter"}})
	FROM still_owed u WHERE o.id = u.id
), from_outbox AS (
	DELETE FROM {{.Table}} f USING still_owed u WHERE f.id = u.id
	RETURNING {{template "freshRow" "f"}}
), moved AS (
	INSERT INTO {{.Owed}} ({{template "freshRow" ""}}, {{template "stateColumns"}}, {{template "routeColumns"}})
	SELECT {{template "freshRow" "f"}}, {{template "stateAfter" .}}, {{template "routeAfter"}}
	FROM from_outbox f JOIN still_owed u ON u.id = f.id CROSS JOIN LATERAL (SELECT {{template "freshState"}}) o
), done AS (
	SELECT * FROM unnest(@done_ids::bigint[], @amqp_done_now::boolean[], @nats_done_now::boolean[]) AS d(id, amqp_now, nats_now)
), del AS (
	DELETE FROM {{.Owed}} o USING done d WHERE o.id = d.id
	RETURNING o.message_id, o.id,
		CASE WHEN d.amqp_now THEN clock_timestamp() ELSE o.amqp_delivered_at END AS amqp_at,
		CASE WHEN d.nats_now THEN clock_timestamp() ELSE o.nats_delivered_at END AS nats_at,
		d.amqp_now OR {{template "amqpSent"}} AS amqp_sent
), del_fresh AS (
	DELETE FROM {{.Table}} f USING done d WHERE f.id = d.id
	RETURNING f.message_id, f.id,
		CASE WHEN d.amqp_now THEN clock_timestamp() END AS amqp_at,
		CASE WHEN d.nats_now THEN clock_timestamp() END AS nats_at,
		d.amqp_now AS amqp_sent
)
{{template "intoDelivered" .}}
SELECT id, message_id, amqp_at, nats_at, amqp_sent, clock_timestamp() FROM (SELECT * FROM del UNION ALL SELECT * FROM del_fresh) f
{{end}}

-- stateColumns, stateAfter: a row's delivery state, and what batch outcome
-- u (a row of Record's still_owed) makes of o's. An outcome (Outcome) is
-- None (not attempted), Delivered, Retry (failed: retry after the
-- backoff), Parked, or Outage (the broker unavailable: retry after the
-- backoff, not counted as an attempt).
{{define "stateColumns"}}amqp_delivered_at, amqp_attempts, amqp_retry_at, amqp_parked_at, amqp_last_error,
		nats_delivered_at, nats_attempts, nats_retry_at, nats_parked_at, nats_last_error{{end}}
{{define "stateAfter"}}
		CASE WHEN u.amqp_outcome = {{.Outcome.Delivered}} THEN clock_timestamp() ELSE o.amqp_delivered_at END,
		o.amqp_attempts + (u.amqp_outcome IN ({{.Outcome.Delivered}}, {{.Outcome.Retry}}, {{.Outcome.Parked}}))::int,
		CASE WHEN u.amqp_outcome IN ({{.Outcome.Retry}}, {{.Outcome.Outage}}) THEN clock_timestamp() + u.amqp_backoff_ms * interval '1 millisecond' WHEN u.amqp_outcome = {{.Outcome.Delivered}} THEN NULL ELSE o.amqp_retry_at END,
		CASE WHEN u.amqp_outcome = {{.Outcome.Parked}} THEN clock_timestamp() ELSE o.amqp_parked_at END,
		CASE WHEN u.amqp_outcome IN ({{.Outcome.Retry}}, {{.Outcome.Parked}}, {{.Outcome.Outage}}) THEN u.amqp_error ELSE o.amqp_last_error END,
		CASE WHEN u.nats_outcome = {{.Outcome.Delivered}} THEN clock_timestamp() ELSE o.nats_delivered_at END,
		o.nats_attempts + (u.nats_outcome IN ({{.Outcome.Delivered}}, {{.Outcome.Retry}}, {{.Outcome.Parked}}))::int,
		CASE WHEN u.nats_outcome IN ({{.Outcome.Retry}}, {{.Outcome.Outage}}) THEN clock_timestamp() + u.nats_backoff_ms * interval '1 millisecond' WHEN u.nats_outcome = {{.Outcome.Delivered}} THEN NULL ELSE o.nats_retry_at END,
		CASE WHEN u.nats_outcome = {{.Outcome.Parked}} THEN clock_timestamp() ELSE o.nats_parked_at END,
		CASE WHEN u.nats_outcome IN ({{.Outcome.Retry}}, {{.Outcome.Parked}}, {{.Outcome.Outage}}) THEN u.nats_error ELSE o.nats_last_error END{{end}}

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

-- LateWait locks the outbox's rows of message ids @message_ids, waiting for a batch
-- that holds them to end: Late, the next statement, then sees what it
-- recorded (a row it left owed is in the owed table by then).
{{define "LateWait"}}SELECT count(*) FROM (SELECT id FROM {{.Table}} WHERE message_id = ANY (@message_ids::uuid[]) ORDER BY id FOR UPDATE) l{{end}}

-- Late marks the rows of message ids @message_ids delivered to the target, whose
-- confirm came after their batch gave up, and returns each row's id and
-- whether each target has it now: an owed row is updated (and unparked), a
-- row its batch left in the outbox moves to the owed table, and its topic
-- and headers come back too, for LateRoute. Each table's
-- rows are locked in id order, outbox first, so two instances recording
-- overlapping sets wait instead of deadlocking.
{{define "Late"}}
WITH from_outbox AS (
	DELETE FROM {{.Table}} f WHERE f.id IN (SELECT id FROM {{.Table}} WHERE message_id = ANY (@message_ids::uuid[]) ORDER BY id FOR UPDATE)
	RETURNING {{template "freshRow" "f"}}
), moved AS (
	INSERT INTO {{.Owed}} ({{template "freshRow" ""}}, {{.P}}_delivered_at)
	SELECT {{template "freshRow" "f"}}, clock_timestamp() FROM from_outbox f
	RETURNING id, amqp_delivered_at IS NOT NULL, nats_delivered_at IS NOT NULL, topic, headers::text
), upd AS (
	UPDATE {{.Owed}} o SET {{.P}}_delivered_at = clock_timestamp(), {{.P}}_retry_at = NULL, {{.P}}_parked_at = NULL, {{.P}}_last_error = NULL
	FROM (SELECT id FROM {{.Owed}} WHERE message_id = ANY (@message_ids::uuid[]) AND {{.P}}_delivered_at IS NULL AND done_at IS NULL ORDER BY id FOR UPDATE) l
	WHERE o.id = l.id
	RETURNING o.id, o.amqp_delivered_at IS NOT NULL, o.nats_delivered_at IS NOT NULL, NULL::text, NULL::text
)
SELECT * FROM moved UNION ALL SELECT * FROM upd
{{end}}

-- LateRoute records the route of rows Late moved, as the relay that
-- published them resolved it (parameters: LateRouteParams). A row routed
-- already keeps its route.
{{define "LateRoute"}}
UPDATE {{.Owed}} o SET ({{template "routeColumns"}}) = (u.r_exchange, u.r_key, u.r_subject, u.r_stream)
FROM unnest(@ids::bigint[], @route_exchanges::text[], @route_routing_keys::text[], @route_subjects::text[], @route_streams::text[])
	AS u(id, r_exchange, r_key, r_subject, r_stream)
WHERE o.id = u.id AND o.nats_subject IS NULL
{{end}}

-- Finish moves the rows JetStream has (the nats-only phase) out of the owed
-- table, in id order past @after, at most @limit rows: through the owed_in_nats
-- index (00020), which holds only them, never the owed table's other rows
-- or the dead ones a held horizon keeps. It returns the slice's last id, its
-- rows, and the rows moved. It moves nothing once the table's phase is set
-- to another: a relay that has not read the change yet would finish rows
-- the relays in dual write still send RabbitMQ. It runs after PhaseShare, in
-- its transaction, so its snapshot sees every change before it and no
-- change commits until it has.
{{define "Finish"}}
WITH slice AS MATERIALIZED (
	SELECT id FROM {{.Owed}} WHERE nats_delivered_at IS NOT NULL AND done_at IS NULL AND id > @after ORDER BY id LIMIT @limit
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
