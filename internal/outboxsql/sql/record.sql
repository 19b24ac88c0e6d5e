-- Record writes a batch's outcomes in one statement: rows still owed are
-- updated, rows every enabled target has move to the delivered table.
-- $1..$7: id, then per target outcome (0 none, 1 delivered, 2 retry, 3
-- parked, 4 outage: retry, not an attempt), error, backoff in ms; $8..$10:
-- id, then per target whether this batch delivered it.
{{define "Record"}}
WITH upd AS (
	UPDATE {{.Table}} o SET
		amqp_delivered_at = CASE WHEN u.a = 1 THEN clock_timestamp() ELSE o.amqp_delivered_at END,
		amqp_attempts     = o.amqp_attempts + (u.a IN (1, 2, 3))::int,
		amqp_retry_at     = CASE WHEN u.a IN (2, 4) THEN clock_timestamp() + u.ab * interval '1 millisecond' WHEN u.a = 1 THEN NULL ELSE o.amqp_retry_at END,
		amqp_parked_at    = CASE WHEN u.a = 3 THEN clock_timestamp() ELSE o.amqp_parked_at END,
		amqp_last_error   = CASE WHEN u.a IN (2, 3, 4) THEN u.ae ELSE o.amqp_last_error END,
		nats_delivered_at = CASE WHEN u.n = 1 THEN clock_timestamp() ELSE o.nats_delivered_at END,
		nats_attempts     = o.nats_attempts + (u.n IN (1, 2, 3))::int,
		nats_retry_at     = CASE WHEN u.n IN (2, 4) THEN clock_timestamp() + u.nb * interval '1 millisecond' WHEN u.n = 1 THEN NULL ELSE o.nats_retry_at END,
		nats_parked_at    = CASE WHEN u.n = 3 THEN clock_timestamp() ELSE o.nats_parked_at END,
		nats_last_error   = CASE WHEN u.n IN (2, 3, 4) THEN u.ne ELSE o.nats_last_error END
	FROM unnest($1::bigint[], $2::smallint[], $3::text[], $4::bigint[], $5::smallint[], $6::text[], $7::bigint[])
		AS u(id, a, ae, ab, n, ne, nb)
	WHERE o.id = u.id
), del AS (
	DELETE FROM {{.Table}} o USING unnest($8::bigint[], $9::boolean[], $10::boolean[]) AS d(id, a, n)
	WHERE o.id = d.id
	RETURNING o.message_id, o.id,
		CASE WHEN d.a THEN clock_timestamp() ELSE o.amqp_delivered_at END AS amqp_at,
		CASE WHEN d.n THEN clock_timestamp() ELSE o.nats_delivered_at END AS nats_at,
		d.a OR {{template "amqpSent"}} AS amqp_sent
)
{{template "intoDelivered" .}}
SELECT id, message_id, amqp_at, nats_at, amqp_sent, clock_timestamp() FROM del
{{end}}

-- Late marks the rows of message ids $1 delivered to the target, whose
-- confirm came after their batch gave up, and returns each row's id and
-- whether each target has it now. Locked in id order, so two instances
-- recording overlapping sets wait instead of deadlocking; unparks the row.
{{define "Late"}}
UPDATE {{.Table}} o SET {{.P}}_delivered_at = clock_timestamp(), {{.P}}_retry_at = NULL, {{.P}}_parked_at = NULL, {{.P}}_last_error = NULL
FROM (SELECT id FROM {{.Table}} WHERE message_id = ANY ($1::uuid[]) AND {{.P}}_delivered_at IS NULL AND done_at IS NULL ORDER BY id FOR UPDATE) l
WHERE o.id = l.id
RETURNING o.id, o.amqp_delivered_at IS NOT NULL, o.nats_delivered_at IS NOT NULL
{{end}}

-- Finish moves the rows JetStream has (the nats-only phase) out of the next
-- slice of the outbox in id order, past $1, at most $2 rows: the primary
-- key's order, never a scan of the whole backlog. It returns the slice's
-- last id, its rows, and the rows moved. It moves nothing once the table's
-- phase is set to another: a relay that has not read the change yet would
-- finish rows the relays in dual write still send RabbitMQ.
{{define "Finish"}}
WITH slice AS MATERIALIZED (
	SELECT id FROM {{.Table}} WHERE id > $1 ORDER BY id LIMIT $2
), del AS (
	DELETE FROM {{.Table}} o WHERE o.id IN (
		SELECT id FROM {{.Table}} WHERE id IN (SELECT id FROM slice) AND nats_delivered_at IS NOT NULL AND done_at IS NULL
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
