-- `relayd replay`: the lookups of what RabbitMQ has or will get, and the
-- run's progress record (package replay; migration 00009).

-- ReplayDelivered: of message ids $1 (uuids, as text), those RabbitMQ
-- confirmed, in the delivered table: the predicate repeats the message_id
-- index's (amqp_sent AND nats_delivered_at IS NOT NULL), so the lookup stays
-- on it; amqp_delivered_at implies amqp_sent.
{{define "ReplayDelivered"}}
SELECT message_id::text FROM {{.Delivered}}
WHERE message_id = ANY($1::text[]::uuid[]) AND amqp_sent AND nats_delivered_at IS NOT NULL
  AND amqp_delivered_at IS NOT NULL
{{end}}

-- ReplayOwed: of message ids $1 (uuids, as text), those still to relay
-- that RabbitMQ has, or is owed by the relays (they will send it
-- themselves): every row of the outbox, and of the owed table those its
-- predicate holds, through each table's message_id index.
{{define "ReplayOwed"}}
SELECT message_id::text FROM {{.Table}} WHERE message_id = ANY($1::text[]::uuid[])
UNION ALL
SELECT message_id::text FROM {{.Owed}}
WHERE message_id = ANY($1::text[]::uuid[])
  AND (amqp_delivered_at IS NOT NULL OR (amqp_parked_at IS NULL AND done_at IS NULL))
{{end}}

-- ReplayBackfilled: of message ids $1 (every id, as text), those the
-- backfill moved from the legacy queue: RabbitMQ had them first.
{{define "ReplayBackfilled"}}SELECT message_id FROM {{.Backfilled}} WHERE message_id = ANY($1::text[]){{end}}

-- ReplayStranded: of the rows finished without RabbitMQ since $1 (a nats-only
-- period's start), the earliest and latest nats_delivered_at, and how many
-- finished at or after $2 (the period's end; NULL: it goes on). Those came
-- after the end: batches claimed in the period, relays pinned to nats. A
-- range of the primary key (done_at, id), from the period's start.
{{define "ReplayStranded"}}
SELECT min(nats_delivered_at), max(nats_delivered_at), count(*) FILTER (WHERE done_at >= $2::timestamptz)
FROM {{.Delivered}}
WHERE done_at >= $1::timestamptz AND amqp_delivered_at IS NULL AND nats_delivered_at IS NOT NULL
{{end}}

-- ReplayRecordStart: when the delivered record begins (RELAY_RETENTION removes
-- older rows): the primary key's first done_at.
{{define "ReplayRecordStart"}}SELECT min(done_at) FROM {{.Delivered}}{{end}}

-- ReplayClaims: the transactions that hold rows FOR UPDATE now, as a relay's
-- batch does from its claim to its record, by virtual transaction id: every
-- claim locks the outbox in RowShareLock (its walks there lock rows, found or
-- not), which producers and vacuum do not take.
{{define "ReplayClaims"}}
SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks
WHERE locktype = 'relation' AND relation = '{{.Table}}'::regclass AND mode = 'RowShareLock' AND granted
  AND pid <> pg_backend_pid()
{{end}}

-- ReplayClaimsLeft: how many of the transactions $1 (ReplayClaims) are still open.
{{define "ReplayClaimsLeft"}}
SELECT count(DISTINCT virtualtransaction) FROM pg_locks
WHERE locktype = 'relation' AND relation = '{{.Table}}'::regclass AND mode = 'RowShareLock'
  AND virtualtransaction = ANY($1::text[])
{{end}}

-- ReplayLock: held by the session of the running replay, so two runs never
-- publish at once; a crashed run's session lets it go.
{{define "ReplayLock"}}SELECT pg_try_advisory_lock('{{.Replay}}'::regclass::oid::bigint){{end}}

-- ReplayUnlock releases ReplayLock.
{{define "ReplayUnlock"}}SELECT pg_advisory_unlock('{{.Replay}}'::regclass::oid::bigint){{end}}

{{define "replayCols"}}id, stream, exchange, request, window_start, window_end, from_seq, to_seq, position,
	sent, skipped_delivered, skipped_backfilled, skipped_owed, without_id, other_subject, failed_permanent,
	started_at, updated_at, finished_at, abandoned, stream_created{{end}}

-- ReplayRun: run $1.
{{define "ReplayRun"}}SELECT {{template "replayCols"}} FROM {{.Replay}} WHERE id = $1{{end}}

-- ReplayUnfinished: the run not finished, if any.
{{define "ReplayUnfinished"}}SELECT {{template "replayCols"}} FROM {{.Replay}} WHERE finished_at IS NULL{{end}}

-- ReplayLatest: the latest run, finished or not.
{{define "ReplayLatest"}}SELECT {{template "replayCols"}} FROM {{.Replay}} ORDER BY id DESC LIMIT 1{{end}}

-- ReplayOverlap: the latest finished run (not abandoned) of stream $1 whose
-- sequences overlap $2..$3.
{{define "ReplayOverlap"}}
SELECT {{template "replayCols"}} FROM {{.Replay}}
WHERE finished_at IS NOT NULL AND NOT abandoned AND stream = $1 AND from_seq <= $3 AND to_seq >= $2
ORDER BY id DESC LIMIT 1
{{end}}

-- ReplayStart: a new run: $1 stream, $2 exchange, $3 request, $4 window
-- start, $5 window end, $6 from seq, $7 to seq, $8 the stream's creation
-- time; nothing done yet.
{{define "ReplayStart"}}
INSERT INTO {{.Replay}} (stream, exchange, request, window_start, window_end, from_seq, to_seq, position, stream_created)
VALUES ($1, $2, $3, $4, $5, $6::bigint, $7::bigint, $6::bigint - 1, $8)
RETURNING {{template "replayCols"}}
{{end}}

-- ReplayAdvance: run $1, if still at $10 (else another replay moved it), is
-- done up to $2; $3..$9 are added to its counts (sent, skipped delivered,
-- backfilled, owed, without id, other subject, failed permanent); $11 finishes it.
{{define "ReplayAdvance"}}
UPDATE {{.Replay}} SET position = $2, sent = sent + $3, skipped_delivered = skipped_delivered + $4,
	skipped_backfilled = skipped_backfilled + $5, skipped_owed = skipped_owed + $6, without_id = without_id + $7,
	other_subject = other_subject + $8, failed_permanent = failed_permanent + $9, updated_at = now(),
	finished_at = CASE WHEN $11::boolean THEN now() END
WHERE id = $1 AND position = $10 AND finished_at IS NULL
{{end}}

-- ReplayAbandon: --restart gives up the unfinished run.
{{define "ReplayAbandon"}}UPDATE {{.Replay}} SET finished_at = now(), abandoned = true, updated_at = now() WHERE finished_at IS NULL{{end}}
