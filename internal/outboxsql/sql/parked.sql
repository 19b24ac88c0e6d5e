-- parkedRows: the rows parked for amqp ($1) or nats ($2), through the
-- parked index only; the statements below order and limit them.
{{define "parkedRows"}}
SELECT id, message_id::text, topic, created_at,
	amqp_parked_at, amqp_attempts, coalesce(amqp_last_error, ''),
	nats_parked_at, nats_attempts, coalesce(nats_last_error, '')
FROM {{.Owed}}
WHERE {{template "parkedIndex"}}
  AND (($1 AND amqp_parked_at IS NOT NULL) OR ($2 AND nats_parked_at IS NOT NULL))
{{end}}

-- ListParked: up to $3 parked rows, oldest first.
{{define "ListParked"}}
{{- template "parkedRows" .}}
ORDER BY id LIMIT $3
{{end}}

-- ListParkedLast: ListParked, the highest ids first: the rows written
-- last, not the rows parked last (the parked index is on id).
{{define "ListParkedLast"}}
{{- template "parkedRows" .}}
ORDER BY id DESC LIMIT $3
{{end}}

-- RetryParked puts the target's parked rows back in line, the rows with ids
-- $2 or every one when $1; attempts start again from 0. A row no target
-- has a publish outstanding for (each has it, or is parked) forgets its
-- route: it goes by its topic and headers as they are now, which the
-- operator may have fixed.
{{define "RetryParked"}}
UPDATE {{.Owed}}
SET {{.P}}_parked_at = NULL, {{.P}}_attempts = 0, {{.P}}_retry_at = NULL,
	({{template "routeColumns"}}) = (SELECT {{template "routeColumns"}} WHERE NOT (
		(amqp_delivered_at IS NOT NULL OR amqp_parked_at IS NOT NULL) AND (nats_delivered_at IS NOT NULL OR nats_parked_at IS NOT NULL)))
WHERE {{.P}}_parked_at IS NOT NULL AND ($1 OR id = ANY($2))
{{end}}
