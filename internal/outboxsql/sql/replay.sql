-- `relayd replay`: the lookups of what RabbitMQ has or will get, and the
-- run's progress record (package replay; migration 00009).

-- ReplayDelivered: of message ids @uuids (uuids, as text), those RabbitMQ
-- confirmed, in the delivered table: the predicate repeats the message_id
-- index's (amqp_sent AND nats_delivered_at IS NOT NULL), so the lookup stays
-- on it; amqp_delivered_at implies amqp_sent.
{{define "ReplayDelivered"}}
SELECT message_id::text FROM {{.Delivered}}
WHERE message_id = ANY(@uuids::text[]::uuid[]) AND amqp_sent AND nats_delivered_at IS NOT NULL
  AND amqp_delivered_at IS NOT NULL
{{end}}

-- ReplayOwed: of message ids @uuids (uuids, as text), those still to relay
-- that RabbitMQ has, or is owed by the relays (they will send it
-- themselves): every row of the outbox, and of the owed table those its
-- predicate holds, through each table's message_id index.
{{define "ReplayOwed"}}
SELECT message_id::text FROM {{.Table}} WHERE message_id = ANY(@uuids::text[]::uuid[])
UNION ALL
SELECT message_id::text FROM {{.Owed}}
WHERE message_id = ANY(@uuids::text[]::uuid[])
  AND (amqp_delivered_at IS NOT NULL OR (amqp_parked_at IS NULL AND done_at IS NULL))
{{end}}

-- ReplayBackfilled: of message ids @ids (every id, as text), those the
-- backfill moved from the legacy queue: RabbitMQ had them first.
{{define "ReplayBackfilled"}}SELECT message_id FROM {{.Backfilled}} WHERE message_id = ANY(@ids::text[]){{end}}

-- ReplayStranded: of the rows finished without RabbitMQ since @start (a nats-only
-- period's start), the earliest and latest nats_delivered_at, and how many
-- finished at or after @end (the period's end; NULL: it goes on). Those came
-- after the end: batches claimed in the period, relays pinned to nats. A
-- range of the primary key (done_at, id), from the period's start.
{{define "ReplayStranded"}}
SELECT min(nats_delivered_at), max(nats_delivered_at), count(*) FILTER (WHERE done_at >= @end::timestamptz)
FROM {{.Delivered}}
WHERE done_at >= @start::timestamptz AND amqp_delivered_at IS NULL AND nats_delivered_at IS NOT NULL
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

-- ReplayClaimsLeft: how many of the transactions @transactions (ReplayClaims) are still open.
{{define "ReplayClaimsLeft"}}
SELECT count(DISTINCT virtualtransaction) FROM pg_locks
WHERE locktype = 'relation' AND relation = '{{.Table}}'::regclass AND mode = 'RowShareLock'
  AND virtualtransaction = ANY(@transactions::text[])
{{end}}

-- ReplayLock: held by the session of the running replay, so two runs never
-- publish at once; a crashed run's session lets it go.
{{define "ReplayLock"}}SELECT pg_try_advisory_lock('{{.Replay}}'::regclass::oid::bigint){{end}}

-- ReplayUnlock releases ReplayLock.
{{define "ReplayUnlock"}}SELECT pg_advisory_unlock('{{.Replay}}'::regclass::oid::bigint){{end}}

{{define "replayCols"}}id, stream, exchange, request, window_start, window_end, from_seq, to_seq, position,
	sent, skipped_delivered, skipped_backfilled, skipped_owed, without_id, other_subject, failed_permanent,
	started_at, updated_at, finished_at, abandoned, stream_created{{end}}

-- ReplayRun: run @id.
{{define "ReplayRun"}}SELECT {{template "replayCols"}} FROM {{.Replay}} WHERE id = @id{{end}}

-- ReplayUnfinished: the run not finished, if any.
{{define "ReplayUnfinished"}}SELECT {{template "replayCols"}} FROM {{.Replay}} WHERE finished_at IS NULL{{end}}

-- ReplayLatest: the latest run, finished or not.
{{define "ReplayLatest"}}SELECT {{template "replayCols"}} FROM {{.Replay}} ORDER BY id DESC LIMIT 1{{end}}

-- ReplayOverlap: the latest finished run (not abandoned) of @stream whose
-- sequences overlap @from_seq..@to_seq.
{{define "ReplayOverlap"}}
SELECT {{template "replayCols"}} FROM {{.Replay}}
WHERE finished_at IS NOT NULL AND NOT abandoned AND stream = @stream AND from_seq <= @to_seq AND to_seq >= @from_seq
ORDER BY id DESC LIMIT 1
{{end}}

-- ReplayStart: a new run (parameters: ReplayStartParams); nothing done
-- yet.
{{define "ReplayStart"}}
INSERT INTO {{.Replay}} (stream, exchange, request, window_start, window_end, from_seq, to_seq, position, stream_created)
VALUES (@stream, @exchange, @request, @window_start, @window_end, @from_seq::bigint, @to_seq::bigint, @from_seq::bigint - 1, @stream_created)
RETURNING {{template "replayCols"}}
{{end}}

-- ReplayAdvance: run @id, if still at @expected (else another replay moved
-- it), is done up to @position; the counts are added to its own; @finish
-- finishes it.
{{define "ReplayAdvance"}}
UPDATE {{.Replay}} SET position = @position, sent = sent + @sent, skipped_delivered = skipped_delivered + @skipped_delivered,
	skipped_backfilled = skipped_backfilled + @skipped_backfilled, skipped_owed = skipped_owed + @skipped_owed, without_id = without_id + @without_id,
	other_subject = other_subject + @other_subject, failed_permanent = failed_permanent + @failed_permanent, updated_at = now(),
	finished_at = CASE WHEN @finish::boolean THEN now() END
WHERE id = @id AND position = @expected AND finished_at IS NULL
{{end}}

-- ReplayAbandon: --restart gives up the unfinished run.
{{define "ReplayAbandon"}}UPDATE {{.Replay}} SET finished_at = now(), abandoned = true, updated_at = now() WHERE finished_at IS NULL{{end}}
