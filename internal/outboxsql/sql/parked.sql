-- parkedRows: the rows parked for amqp (@amqp) or nats (@nats), through the
-- parked index only; the statements below order and limit them.
{{define "parkedRows"}}
SELECT id, message_id::text, topic, created_at,
	amqp_parked_at, amqp_attempts, coalesce(amqp_last_error, ''),
	nats_parked_at, nats_attempts, coalesce(nats_last_error, '')
FROM {{.Owed}}
WHERE {{template "parkedIndex"}}
  AND ((@amqp AND amqp_parked_at IS NOT NULL) OR (@nats AND nats_parked_at IS NOT NULL))
{{end}}

-- ListParked: up to @limit parked rows, oldest first.
{{define "ListParked"}}
{{- template "parkedRows" .}}
ORDER BY id LIMIT @limit
{{end}}

-- ListParkedLast: ListParked, the highest ids first: the rows written
-- last, not the rows parked last (the parked index is on id).
{{define "ListParkedLast"}}
{{- template "parkedRows" .}}
ORDER BY id DESC LIMIT @limit
{{end}}

-- RetryParked puts the target's parked rows back in line, the rows with ids
-- @ids or every one when @all; attempts start again from 0. A row no target
-- has a publish outstanding for (each has it, or is parked) forgets its
-- route: it goes by its topic and headers as they are now, which the
-- operator may have fixed. It returns how many it put back and the lowest
-- id (0: none), which the relays' owed floors may have passed.
{{define "RetryParked"}}
WITH put AS (
	UPDATE {{.Owed}}
	SET {{.P}}_parked_at = NULL, {{.P}}_attempts = 0, {{.P}}_retry_at = NULL,
		({{template "routeColumns"}}) = (SELECT {{template "routeColumns"}} WHERE NOT (
			(amqp_delivered_at IS NOT NULL OR amqp_parked_at IS NOT NULL) AND (nats_delivered_at IS NOT NULL OR nats_parked_at IS NOT NULL)))
	WHERE {{.P}}_parked_at IS NOT NULL AND (@all OR id = ANY(@ids))
	RETURNING id
)
SELECT count(*), coalesce(min(id), 0) FROM put
{{end}}
