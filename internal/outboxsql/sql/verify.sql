-- VerifyOutbox: the (message id, delivered at) pairs delivered to JetStream
-- between @since and @until, an id once. Rows delivered to every target are in the
-- delivered table, the rest in the owed table; done_at >= nats_delivered_at, so
-- the delivered table's walk starts on its done_at index.
{{define "VerifyOutbox"}}
SELECT DISTINCT ON (msg_id) msg_id, at FROM (
	SELECT message_id::text AS msg_id, nats_delivered_at AS at FROM {{.Owed}}
	WHERE nats_delivered_at >= @since AND nats_delivered_at <= @until
	UNION ALL
	SELECT message_id::text, nats_delivered_at FROM {{.Delivered}}
	WHERE done_at >= @since AND nats_delivered_at >= @since AND nats_delivered_at <= @until
) w ORDER BY msg_id, at
{{end}}

-- VerifyBackfill: the (message id, moved at) pairs the backfill moved
-- between @since and @until.
{{define "VerifyBackfill"}}
SELECT message_id, moved_at FROM {{.Backfilled}}
WHERE moved_at >= @since AND moved_at <= @until
{{end}}

-- A verify run's statements, on temporary tables in the session of the one
-- connection the run holds (VerifyRun; package verify). .Stream holds the
-- stream's (message id, sequence) pairs, .Outbox and .Backfill the ledgers'
-- pairs (VerifyOutbox, VerifyBackfill), .Dups the ids the stream holds more
-- than once; .Ledger is one of the two ledgers.

-- VerifyCreate drops what an earlier run left and creates the tables.
{{define "VerifyCreate"}}
DROP TABLE IF EXISTS {{.Stream}}, {{.Outbox}}, {{.Backfill}}, {{.Dups}};
CREATE TEMP TABLE {{.Stream}} (msg_id text NOT NULL, seq bigint NOT NULL);
CREATE TEMP TABLE {{.Outbox}} (msg_id text NOT NULL, at timestamptz NOT NULL);
CREATE TEMP TABLE {{.Backfill}} (msg_id text NOT NULL, at timestamptz NOT NULL)
{{end}}

-- VerifyFillOutbox, VerifyFillBackfill copy the ledgers' pairs into the
-- run's tables, server side.
{{define "VerifyFillOutbox"}}INSERT INTO {{.Outbox}} (msg_id, at) {{template "VerifyOutbox" .}}{{end}}
{{define "VerifyFillBackfill"}}INSERT INTO {{.Backfill}} (msg_id, at) {{template "VerifyBackfill" .}}{{end}}


-- VerifyIndex indexes the scanned pairs and collects the stream's
-- duplicates, the first .MaxSeqs sequences of each.
{{define "VerifyIndex"}}
CREATE INDEX ON {{.Stream}} (msg_id);
ANALYZE {{.Stream}};
ANALYZE {{.Outbox}};
ANALYZE {{.Backfill}};
CREATE TEMP TABLE {{.Dups}} AS
	SELECT msg_id, count(*) AS copies, (array_agg(seq ORDER BY seq))[1:{{.MaxSeqs}}] AS seqs, min(seq) AS first_seq
	FROM {{.Stream}} GROUP BY msg_id HAVING count(*) > 1;
ANALYZE {{.Dups}};
{{end}}

-- VerifyDuplicates: how many ids the stream holds more than once, and the
-- extra copies; VerifyDuplicateExamples the first @limit of them.
{{define "VerifyDuplicates"}}SELECT count(*), coalesce(sum(copies - 1), 0) FROM {{.Dups}}{{end}}
{{define "VerifyDuplicateExamples"}}SELECT msg_id, copies, seqs FROM {{.Dups}} ORDER BY first_seq LIMIT @limit{{end}}

-- VerifyMissing: how many of the ledger's ids the stream lacks;
-- VerifyMissingExamples the first @limit of them.
{{define "verifyMissing"}} l WHERE NOT EXISTS (SELECT 1 FROM {{.Stream}} s WHERE s.msg_id = l.msg_id){{end}}
{{define "VerifyMissing"}}SELECT count(*) FROM {{.Ledger}}{{template "verifyMissing" .}}{{end}}
{{define "VerifyMissingExamples"}}SELECT l.msg_id, l.at FROM {{.Ledger}}{{template "verifyMissing" .}} ORDER BY l.at, l.msg_id LIMIT @limit{{end}}

-- VerifyDuplicated: how many of the ledger's ids the stream holds more than
-- once; VerifyDuplicatedExamples the first @limit of them.
{{define "verifyDuplicated"}} FROM {{.Dups}} d WHERE EXISTS (SELECT 1 FROM {{.Ledger}} l WHERE l.msg_id = d.msg_id){{end}}
{{define "VerifyDuplicated"}}SELECT count(*){{template "verifyDuplicated" .}}{{end}}
{{define "VerifyDuplicatedExamples"}}SELECT d.msg_id, d.copies, d.seqs{{template "verifyDuplicated" .}} ORDER BY d.first_seq LIMIT @limit{{end}}

-- VerifyDrop drops the run's tables.
{{define "VerifyDrop"}}DROP TABLE IF EXISTS {{.Stream}}, {{.Outbox}}, {{.Backfill}}, {{.Dups}}{{end}}
