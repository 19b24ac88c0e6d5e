-- Claim takes a batch: per target the heads of keys and the unkeyed rows
-- of the owed table, each walk over its own partial index in id order, then
-- the fresh rows of the outbox, owed to every active target, the keyed
-- heads and the unkeyed rows in one walk each; all locked SKIP LOCKED
-- (docs/design.md, "The claim statement"). $1, $2 amqp, nats active; $3
-- batch size; $4 skip parked keys; $5 keyed window; $6 keyed rows per
-- target; $7 floor of the owed table's unkeyed walks; $8 rows this relay's
-- batches hold; $9, $10 the outbox's unkeyed walk takes ids in ($9, $10];
-- $11 floor of its keyed walks. The first row is the statement's snapshot
-- (id 0, an empty message id): its xmin, xmax and running transaction ids,
-- the outbox's lowest keyed row above $11, and NULL (see Recheck); the
-- claimed rows leave them NULL.
{{define "Claim"}}
WITH h_a AS MATERIALIZED ({{template "heads" .AMQP}}
), a_k AS (
	SELECT {{template "claimColumns"}}, true AS want_amqp,
		($2::boolean AND {{template "claimable" .NATS}} AND {{template "keyFree" (.NATS.Of .Owed)}}) AS want_nats
	FROM {{.Owed}}
	WHERE id = ANY (ARRAY(SELECT id FROM h_a EXCEPT SELECT unnest($8::bigint[])))
	  AND key IS NOT NULL AND {{template "claimable" .AMQP}} AND {{template "noFreshBefore" .}}
	ORDER BY id LIMIT $6 FOR UPDATE SKIP LOCKED
), a_u AS (
	SELECT {{template "claimColumns"}}, true AS want_amqp,
		($2::boolean AND {{template "claimable" .NATS}}) AS want_nats
	FROM {{.Owed}}
	WHERE $1::boolean AND key IS NULL AND {{template "claimable" .AMQP}} AND id > $7::bigint
	ORDER BY id LIMIT $3 - (SELECT count(*) FROM a_k) FOR UPDATE SKIP LOCKED
), h_n AS MATERIALIZED ({{template "heads" (.NATS.Below "a_k" "$6")}}
), n_u AS (
	SELECT {{template "claimColumns"}}, false AS want_amqp, true AS want_nats
	FROM {{.Owed}}
	WHERE $2::boolean AND key IS NULL AND {{template "claimable" .NATS}} AND id > $7::bigint
	  AND id NOT IN (SELECT id FROM a_u) AND {{template "below" (below "a_u" "$3 - (SELECT count(*) FROM a_k)")}}
	  AND NOT ($1::boolean AND {{template "claimable" .AMQP}})
	ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED
), n_k AS (
	SELECT {{template "claimColumns"}}, false AS want_amqp, true AS want_nats
	FROM {{.Owed}}
	WHERE id = ANY (ARRAY(SELECT id FROM h_n EXCEPT SELECT id FROM h_a EXCEPT SELECT unnest($8::bigint[])))
	  AND key IS NOT NULL AND {{template "claimable" .NATS}} AND {{template "noFreshBefore" .}}
	  AND id NOT IN (SELECT id FROM a_k)
	ORDER BY id LIMIT $6 FOR UPDATE SKIP LOCKED
), f_h AS MATERIALIZED ({{template "freshHeads" .}}
), f_k AS (
	SELECT {{template "freshColumns"}},
		$1::boolean AND {{template "keyFree" (.AMQP.Of "f")}} AS want_amqp,
		$2::boolean AND {{template "keyFree" (.NATS.Of "f")}} AS want_nats
	FROM {{.Table}} f
	WHERE id = ANY (ARRAY(SELECT id FROM f_h EXCEPT SELECT unnest($8::bigint[])))
	  AND key IS NOT NULL
	  AND (($1::boolean AND {{template "keyFree" (.AMQP.Of "f")}}) OR ($2::boolean AND {{template "keyFree" (.NATS.Of "f")}}))
	ORDER BY id LIMIT greatest(0, $6 - greatest((SELECT count(*) FROM a_k), (SELECT count(*) FROM n_k))) FOR UPDATE SKIP LOCKED
), f_u AS (
	SELECT {{template "freshColumns"}}, $1::boolean AS want_amqp, $2::boolean AS want_nats
	FROM {{.Table}} f
	WHERE ($1::boolean OR $2::boolean) AND key IS NULL AND id > $9::bigint AND id <= $10::bigint
	ORDER BY key, id LIMIT greatest(0, $3 - (SELECT count(*) FROM a_k) - (SELECT count(*) FROM a_u)
		- (SELECT count(*) FROM n_u) - (SELECT count(*) FROM n_k) - (SELECT count(*) FROM f_k)) FOR UPDATE SKIP LOCKED
), snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s
)
SELECT 0::bigint, ''::text, ''::text, NULL::text, NULL::text, ''::bytea, now(), 0, 0, false, false, false,
	NULL::text, NULL::text, NULL::text, NULL::text, false, false,
	pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(s) x),
	(SELECT min(id) FROM {{.Table}} WHERE key IS NOT NULL AND id > $11::bigint), NULL::bigint[]
FROM snap
UNION ALL
SELECT *, NULL::bigint, NULL::bigint, NULL::bigint[], NULL::bigint, NULL::bigint[]
FROM (SELECT * FROM a_k UNION ALL SELECT * FROM a_u UNION ALL SELECT * FROM n_u UNION ALL SELECT * FROM n_k
	UNION ALL SELECT * FROM f_k UNION ALL SELECT * FROM f_u) c
{{end}}

-- Recheck walks the outbox's unkeyed rows below the floor that other
-- batches held when the floor passed them (docs/design.md, "The claim
-- floor"): those in ($3, $4], which it has not walked yet, and $5, which it
-- saw held before. It takes up to $6 of them, SKIP LOCKED, for the targets
-- $1 (amqp) and $2 (nats), and returns Claim's columns: the first row the
-- statement's snapshot, with the rows it saw and did not take.
{{define "Recheck"}}
WITH v AS MATERIALIZED (
	SELECT id FROM {{.Table}} WHERE key IS NULL AND ((id > $3::bigint AND id <= $4::bigint) OR id = ANY ($5::bigint[]))
), f_u AS (
	SELECT {{template "freshColumns"}}, $1::boolean AS want_amqp, $2::boolean AS want_nats
	FROM {{.Table}} f
	WHERE id = ANY (ARRAY(SELECT id FROM v)) AND key IS NULL
	ORDER BY id LIMIT $6 FOR UPDATE SKIP LOCKED
), snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s
)
SELECT 0::bigint, ''::text, ''::text, NULL::text, NULL::text, ''::bytea, now(), 0, 0, false, false, false,
	NULL::text, NULL::text, NULL::text, NULL::text, false, false,
	pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(s) x),
	NULL::bigint, ARRAY(SELECT id FROM v WHERE id NOT IN (SELECT id FROM f_u) ORDER BY id)
FROM snap
UNION ALL
SELECT *, NULL::bigint, NULL::bigint, NULL::bigint[], NULL::bigint, NULL::bigint[] FROM f_u
{{end}}

-- claimColumns: what the relay reads of a claimed row (store.claim scans them
-- in this order, then want_amqp, want_nats and the snapshot), whether it is
-- fresh, and its recorded route (NULL: none yet).
{{define "claimColumns"}}id, message_id::text, topic, key, headers::text, payload, created_at, amqp_attempts, nats_attempts,
		amqp_delivered_at IS NOT NULL, nats_delivered_at IS NOT NULL, false, amqp_exchange, amqp_routing_key, nats_subject, nats_stream{{end}}

-- freshColumns: claimColumns of a fresh row: nothing tried, nothing
-- delivered, no route, from the outbox.
{{define "freshColumns"}}id, message_id::text, topic, key, headers::text, payload, created_at, 0, 0, false, false, true,
		NULL::text, NULL::text, NULL::text, NULL::text{{end}}

-- heads: the first row of each key among the oldest $5 keyed rows owed to
-- the target (w, min(id) hashed by key), less the waiting keys; a window
-- that few keys fill is topped up by a skip scan of key_pending (ks), at
-- most 2 × $6 keys.
{{define "heads"}}WITH RECURSIVE w AS MATERIALIZED (
		SELECT key, min(id) AS id, count(*) AS n FROM (
			SELECT id, key FROM {{.Owed}} WHERE {{template "active" .}} AND key IS NOT NULL AND {{template "owed" .}}
			  AND key NOT IN ({{template "waitingKeys" .}})
			ORDER BY id LIMIT $5) r
		GROUP BY key
	), ks(key, id, n) AS (
		SELECT k.key, k.id, 1 FROM (
			SELECT key, id FROM {{.Owed}} WHERE key IS NOT NULL AND {{template "holdsKey" .}}
			ORDER BY key, id LIMIT 1) k
		WHERE {{.Enabled}} AND (SELECT sum(n) >= $5 AND count(*) * 4 < $5 FROM w)
		UNION ALL
		SELECT k.key, k.id, ks.n + 1 FROM ks CROSS JOIN LATERAL (
			SELECT key, id FROM {{.Owed}} WHERE key IS NOT NULL AND key > ks.key AND {{template "holdsKey" .}}
			ORDER BY key, id LIMIT 1) k
		WHERE ks.n < $6 * 2
	)
	SELECT id FROM w
	UNION ALL
	SELECT id FROM ks WHERE {{template "active" .}} AND key NOT IN (SELECT key FROM w) AND key NOT IN ({{template "waitingKeys" .}}){{end}}

-- active: the target is active, and for a bounded walk, below the bound.
{{define "active"}}{{.Enabled}}{{with .Bound}} AND {{template "below" .}}{{end}}{{end}}

-- below: a JetStream walk stays below the RabbitMQ walk .Walk when that came
-- back full (.Limit rows), so JetStream does not run ahead of RabbitMQ.
{{define "below"}}id < CASE WHEN $1::boolean AND (SELECT count(*) FROM {{.Walk}}) >= {{.Limit}} THEN (SELECT max(id) FROM {{.Walk}}) ELSE 9223372036854775807 END{{end}}

-- noFreshBefore: no earlier row of the owed row's key is still in the outbox
-- (its transaction committed after this row was first claimed).
{{define "noFreshBefore"}}NOT EXISTS (SELECT 1 FROM {{.Table}} e WHERE e.key = {{.Owed}}.key AND e.id < {{.Owed}}.id){{end}}

-- keyFree: no earlier row of row .Row's key is owed to the target in the
-- owed table: for a fresh row, and for a row the amqp walk took, so that it
-- goes to JetStream in the same batch.
{{define "keyFree"}}NOT EXISTS (
		SELECT 1 FROM {{.Owed}} e WHERE e.key = {{.Row}}.key AND e.id < {{.Row}}.id
		  AND e.{{.P}}_delivered_at IS NULL AND e.done_at IS NULL
		  AND (NOT $4::boolean OR e.{{.P}}_parked_at IS NULL)){{end}}

-- freshHeads: the first row of each key among the outbox's oldest $5 keyed
-- rows above $11, less the keys waiting for every active target, topped up
-- as heads does by a skip scan of key_order.
{{define "freshHeads"}}WITH RECURSIVE w AS MATERIALIZED (
		SELECT key, min(id) AS id, count(*) AS n FROM (
			SELECT id, key FROM {{.Table}} WHERE ($1::boolean OR $2::boolean) AND key IS NOT NULL AND id > $11::bigint
			  AND NOT ({{template "keyWaits" .}})
			ORDER BY id LIMIT $5) r
		GROUP BY key
	), ks(key, id, n) AS (
		SELECT k.key, k.id, 1 FROM (
			SELECT key, id FROM {{.Table}} WHERE key IS NOT NULL AND id > $11::bigint ORDER BY key, id LIMIT 1) k
		WHERE ($1::boolean OR $2::boolean) AND (SELECT sum(n) >= $5 AND count(*) * 4 < $5 FROM w)
		UNION ALL
		SELECT k.key, k.id, ks.n + 1 FROM ks CROSS JOIN LATERAL (
			SELECT key, id FROM {{.Table}} WHERE key IS NOT NULL AND key > ks.key AND id > $11::bigint ORDER BY key, id LIMIT 1) k
		WHERE ks.n < $6 * 2
	)
	SELECT id FROM w
	UNION ALL
	SELECT id FROM ks WHERE key NOT IN (SELECT key FROM w) AND NOT ({{template "keyWaits" .}}){{end}}

-- keyWaits: the key waits for every active target.
{{define "keyWaits"}}(NOT $1::boolean OR key IN ({{template "waitingKeys" .AMQP}}))
			  AND (NOT $2::boolean OR key IN ({{template "waitingKeys" .NATS}})){{end}}
