-- Predicates the statements share. Each takes a target: .P is its column
-- prefix (amqp or nats), .Owed the table of rows with a delivery state.

-- owed: a row still owed to the target; the predicate of its pending indexes.
{{define "owed"}}{{.P}}_delivered_at IS NULL AND {{.P}}_parked_at IS NULL AND done_at IS NULL{{end}}

-- claimable: owed, and its retry (if any) due.
{{define "claimable"}}{{template "owed" .}} AND ({{.P}}_retry_at IS NULL OR {{.P}}_retry_at <= now()){{end}}

-- holdsKey: a keyed row whose later rows must wait for it: not delivered,
-- and not parked unless @skip_parked_keys is false. The key_pending index.
{{define "holdsKey"}}{{.P}}_delivered_at IS NULL AND done_at IS NULL AND (NOT @skip_parked_keys::boolean OR {{.P}}_parked_at IS NULL){{end}}

-- waitingKeys: keys held by a row whose retry is not due yet or (unless @skip_parked_keys)
-- that is parked; the key_waiting index holds just those rows.
{{define "waitingKeys"}}SELECT key FROM {{.Owed}} WHERE key IS NOT NULL AND {{.P}}_delivered_at IS NULL AND done_at IS NULL
	AND ({{.P}}_retry_at IS NOT NULL OR {{.P}}_parked_at IS NOT NULL)
	AND (({{.P}}_parked_at IS NULL AND {{.P}}_retry_at > now()) OR ({{.P}}_parked_at IS NOT NULL AND NOT @skip_parked_keys::boolean)){{end}}

-- parkedIndex is the parked index's predicate: a test on a parked column
-- goes with it, so the index answers.
{{define "parkedIndex"}}(amqp_parked_at IS NOT NULL OR nats_parked_at IS NOT NULL){{end}}

-- parked: parked for the target, through the parked index.
{{define "parked"}}{{template "parkedIndex"}} AND {{.P}}_parked_at IS NOT NULL{{end}}

-- amqpSent: RabbitMQ may have row o (delivered, or published at least once:
-- an attempt or an outage leaves an error). Only such rows can be in the
-- legacy queue, so only they enter the delivered table's message_id index.
{{define "amqpSent"}}o.amqp_delivered_at IS NOT NULL OR o.amqp_attempts > 0 OR o.amqp_last_error IS NOT NULL{{end}}

-- intoDelivered: the delivered table's columns, as a row leaving the outbox
-- is recorded.
{{define "intoDelivered"}}INSERT INTO {{.Delivered}} (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, done_at){{end}}
