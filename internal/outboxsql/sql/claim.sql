-- Claim takes a batch: per target the heads of keys and the unkeyed rows
-- of the owed table, each walk over its own partial index in id order, then
-- the fresh rows of the outbox, owed to every active target, the keyed
-- heads and the unkeyed rows in one walk each; all locked SKIP LOCKED
-- (docs/design.md, "The claim statement"). Parameters: ClaimParams. The
-- first row is the statement's snapshot (id 0, an empty message id): its
-- xmin, xmax and running transaction ids, the claim's own transaction id
-- (taken as the first row is, just after the snapshot), the outbox's lowest keyed row
-- above keyedFrom(@keyed_floor), in a sweep (@sweep) the rows its walk passed and
-- could not lock (held by other batches: see Recheck), and the owed table's lowest
-- unkeyed row above @owed_safe still owed to an enabled target, and its
-- lowest keyed row above owed_keyed_from not yet delivered to one (parked
-- or not: one put back must stay its key's head); the claimed rows leave
-- them NULL. owed_keyed_from is keyedFrom of @owed_keyed_floor: another
-- relay may have moved an ended transaction's rows the floor passed there.
{{define "Claim"}}
WITH owed_keyed_from AS MATERIALIZED (SELECT {{template "keyedFrom" "@owed_keyed_floor"}} AS f
), amqp_heads AS MATERIALIZED ({{template "heads" .AMQP}}
), amqp_keyed AS (
	SELECT {{template "claimColumns"}}, true AS want_amqp,
		(@nats_active::boolean AND {{template "claimable" .NATS}} AND {{template "keyFree" (.NATS.Of .Owed)}}) AS want_nats
	FROM {{.Owed}}
	WHERE id = ANY (ARRAY(SELECT id FROM amqp_heads EXCEPT SELECT unnest(@held_ids::bigint[])))
	  AND {{template "claimable" .AMQP}} AND {{template "noFreshBefore" .}}
	ORDER BY id LIMIT @keyed_rows FOR UPDATE SKIP LOCKED
), amqp_unkeyed AS (
	SELECT {{template "claimColumns"}}, true AS want_amqp,
		(@nats_active::boolean AND {{template "claimable" .NATS}}) AS want_nats
	FROM {{.Owed}}
	WHERE @amqp_active::boolean AND key IS NULL AND {{template "claimable" .AMQP}} AND id > @owed_floor::bigint
	ORDER BY id LIMIT @batch_size - (SELECT count(*) FROM amqp_keyed) FOR UPDATE SKIP LOCKED
), nats_heads AS MATERIALIZED ({{template "heads" (.NATS.Below "amqp_keyed" "@keyed_rows")}}
), nats_unkeyed AS (
	SELECT {{template "claimColumns"}}, false AS want_amqp, true AS want_nats
	FROM {{.Owed}}
	WHERE @nats_active::boolean AND key IS NULL AND {{template "claimable" .NATS}} AND id > @owed_floor::bigint
	  AND id NOT IN (SELECT id FROM amqp_unkeyed) AND {{template "below" (below "amqp_unkeyed" "@batch_size - (SELECT count(*) FROM amqp_keyed)")}}
	  AND NOT (@amqp_active::boolean AND {{template "claimable" .AMQP}})
	ORDER BY id LIMIT @batch_size FOR UPDATE SKIP LOCKED
), nats_keyed AS (
	SELECT {{template "claimColumns"}}, false AS want_amqp, true AS want_nats
	FROM {{.Owed}}
	WHERE id = ANY (ARRAY(SELECT id FROM nats_heads EXCEPT SELECT id FROM amqp_heads EXCEPT SELECT unnest(@held_ids::bigint[])))
	  AND {{template "claimable" .NATS}} AND {{template "noFreshBefore" .}}
	  AND id NOT IN (SELECT id FROM amqp_keyed)
	ORDER BY id LIMIT @keyed_rows FOR UPDATE SKIP LOCKED
), fresh_heads AS MATERIALIZED ({{template "freshHeads" .}}
), fresh_keyed AS (
	SELECT {{template "freshColumns"}},
		@amqp_active::boolean AND {{template "keyFree" (.AMQP.Of "f")}} AS want_amqp,
		@nats_active::boolean AND {{template "keyFree" (.NATS.Of "f")}} AS want_nats
	FROM {{.Table}} f
	WHERE id = ANY (ARRAY(SELECT id FROM fresh_heads EXCEPT SELECT unnest(@held_ids::bigint[])))
	  AND key IS NOT NULL
	  AND ((@amqp_active::boolean AND {{template "keyFree" (.AMQP.Of "f")}}) OR (@nats_active::boolean AND {{template "keyFree" (.NATS.Of "f")}}))
	ORDER BY id LIMIT greatest(0, @keyed_rows - greatest((SELECT count(*) FROM amqp_keyed), (SELECT count(*) FROM nats_keyed))) FOR UPDATE SKIP LOCKED
), fresh_unkeyed AS (
	SELECT {{template "freshColumns"}}, @amqp_active::boolean AS want_amqp, @nats_active::boolean AS want_nats
	FROM {{.Table}} f
	WHERE (@amqp_active::boolean OR @nats_active::boolean) AND key IS NULL AND id > @fresh_from::bigint AND id <= @fresh_to::bigint
	ORDER BY key, id LIMIT greatest(0, @batch_size - (SELECT count(*) FROM amqp_keyed) - (SELECT count(*) FROM amqp_unkeyed)
		- (SELECT count(*) FROM nats_unkeyed) - (SELECT count(*) FROM nats_keyed) - (SELECT count(*) FROM fresh_keyed)) FOR UPDATE SKIP LOCKED
), snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s, pg_current_xact_id() AS x
)
SELECT 0::bigint, ''::text, ''::text, NULL::text, NULL::text, ''::bytea, now(), 0, 0, false, false, false,
	NULL::text, NULL::text, NULL::text, NULL::text, false, false,
	pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(s) x), x::text::bigint,
	(SELECT min(id) FROM {{.Table}} WHERE key IS NOT NULL AND id > {{template "keyedFrom" "@keyed_floor"}}),
	CASE WHEN @sweep::boolean THEN ARRAY(SELECT id FROM {{.Table}} WHERE key IS NULL AND id > @fresh_from::bigint
		AND id <= CASE WHEN (SELECT count(*) FROM fresh_unkeyed) >= @batch_size THEN (SELECT max(id) FROM fresh_unkeyed) ELSE @fresh_to::bigint END
		AND id NOT IN (SELECT id FROM fresh_unkeyed) ORDER BY key, id) END,
	least({{template "lowestOwed" (.AMQP.Above "NULL" "@owed_safe")}}, {{template "lowestOwed" (.NATS.Above "NULL" "@owed_safe")}}),
	least({{template "lowestOwed" (.AMQP.Above "NOT NULL" "(SELECT f FROM owed_keyed_from)")}}, {{template "lowestOwed" (.NATS.Above "NOT NULL" "(SELECT f FROM owed_keyed_from)")}},
		(SELECT min(id) FROM {{.Owed}} WHERE key IS NOT NULL AND {{template "parkedIndex"}} AND done_at IS NULL AND id > (SELECT f FROM owed_keyed_from)
		  AND ((@amqp_enabled::boolean AND amqp_parked_at IS NOT NULL AND amqp_delivered_at IS NULL)
		    OR (@nats_enabled::boolean AND nats_parked_at IS NOT NULL AND nats_delivered_at IS NULL))))
FROM snap
UNION ALL
SELECT *, NULL::bigint, NULL::bigint, NULL::bigint[], NULL::bigint, NULL::bigint, NULL::bigint[], NULL::bigint, NULL::bigint
FROM (SELECT * FROM amqp_keyed UNION ALL SELECT * FROM amqp_unkeyed UNION ALL SELECT * FROM nats_unkeyed UNION ALL SELECT * FROM nats_keyed
	UNION ALL SELECT * FROM fresh_keyed UNION ALL SELECT * FROM fresh_unkeyed) c
{{end}}

-- Recheck walks the outbox's unkeyed rows below the floor that other
-- batches held when the floor passed them (docs/design.md, "The claim
-- floor"): those in (@from, @to], which it has not walked yet, and
-- @held_before, which it or another sweep saw held before. It takes up to @limit of them,
-- SKIP LOCKED, for the active targets, and returns Claim's columns: the
-- first row the statement's snapshot, with the rows it saw and did not
-- take. Parameters: RecheckParams.
{{define "Recheck"}}
WITH seen AS MATERIALIZED (
	SELECT id FROM {{.Table}} WHERE key IS NULL AND ((id > @from::bigint AND id <= @to::bigint) OR id = ANY (@held_before::bigint[]))
), fresh_unkeyed AS (
	SELECT {{template "freshColumns"}}, @amqp_active::boolean AS want_amqp, @nats_active::boolean AS want_nats
	FROM {{.Table}} f
	WHERE id = ANY (ARRAY(SELECT id FROM seen)) AND key IS NULL
	ORDER BY id LIMIT @limit FOR UPDATE SKIP LOCKED
), snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s, pg_current_xact_id() AS x
)
SELECT 0::bigint, ''::text, ''::text, NULL::text, NULL::text, ''::bytea, now(), 0, 0, false, false, false,
	NULL::text, NULL::text, NULL::text, NULL::text, false, false,
	pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(s) x), x::text::bigint,
	NULL::bigint, ARRAY(SELECT id FROM seen WHERE id NOT IN (SELECT id FROM fresh_unkeyed) ORDER BY id), NULL::bigint, NULL::bigint
FROM snap
UNION ALL
SELECT *, NULL::bigint, NULL::bigint, NULL::bigint[], NULL::bigint, NULL::bigint, NULL::bigint[], NULL::bigint, NULL::bigint FROM fresh_unkeyed
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

-- heads: the first row of each key among the oldest @keyed_window keyed
-- rows owed to the target (window_keys, min(id) hashed by key), less the
-- waiting keys; a window that few keys fill is topped up by a skip scan of
-- key_pending (skip_scan), at most 2 × @keyed_rows keys.
{{define "heads"}}WITH RECURSIVE window_keys AS MATERIALIZED (
		SELECT key, min(id) AS id, count(*) AS n FROM (
			SELECT id, key FROM {{.Owed}} WHERE {{template "active" .}} AND key IS NOT NULL AND {{template "owed" .}}
			  AND id > (SELECT f FROM owed_keyed_from) AND key NOT IN ({{template "waitingKeys" .}})
			ORDER BY id LIMIT @keyed_window) r
		GROUP BY key
	), skip_scan(key, id, n) AS (
		SELECT k.key, k.id, 1 FROM (
			SELECT key, id FROM {{.Owed}} WHERE key IS NOT NULL AND {{template "holdsKey" .}}
			ORDER BY key, id LIMIT 1) k
		WHERE {{.Enabled}} AND (SELECT sum(n) >= @keyed_window AND count(*) * 4 < @keyed_window FROM window_keys)
		UNION ALL
		SELECT k.key, k.id, skip_scan.n + 1 FROM skip_scan CROSS JOIN LATERAL (
			SELECT key, id FROM {{.Owed}} WHERE key IS NOT NULL AND key > skip_scan.key AND {{template "holdsKey" .}}
			ORDER BY key, id LIMIT 1) k
		WHERE skip_scan.n < @keyed_rows * 2
	)
	SELECT id FROM window_keys
	UNION ALL
	SELECT id FROM skip_scan WHERE {{template "active" .}} AND key NOT IN (SELECT key FROM window_keys) AND key NOT IN ({{template "waitingKeys" .}}){{end}}

-- lowestOwed: the owed table's lowest row above .Floor still owed to the
-- target if the phase enables it, keyed or not as .Key says: one probe of a
-- pending index. A parked row is not owed: an unkeyed one put back
-- (relay.RetryParked) lies below the floors until the next walk from the
-- oldest row.
{{define "lowestOwed"}}(SELECT min(id) FROM {{.Owed}} WHERE @{{.P}}_enabled::boolean AND key IS {{.Key}} AND {{template "owed" .}} AND id > {{.Floor}}::bigint){{end}}

-- active: the target is active, and for a bounded walk, below the bound.
{{define "active"}}{{.Enabled}}{{with .Bound}} AND {{template "below" .}}{{end}}{{end}}

-- below: a JetStream walk stays below the RabbitMQ walk .Walk when that came
-- back full (.Limit rows), so JetStream does not run ahead of RabbitMQ.
{{define "below"}}id < CASE WHEN @amqp_active::boolean AND (SELECT count(*) FROM {{.Walk}}) >= {{.Limit}} THEN (SELECT max(id) FROM {{.Walk}}) ELSE 9223372036854775807 END{{end}}

-- keyedFrom: where the keyed rows this claim can see start: above the floor
-- . (@keyed_floor, @fresh_keyed_floor or @owed_keyed_floor), or at the
-- @keyed_pending_from of a transaction remembered when the floor passed its
-- rows (@keyed_pending_xids) that the claim's snapshot shows ended.
{{define "keyedFrom"}}(SELECT least({{.}}::bigint, min(p.f))
		FROM unnest(@keyed_pending_xids::bigint[], @keyed_pending_from::bigint[]) p(x, f)
		WHERE pg_visible_in_snapshot(x::text::xid8, pg_current_snapshot())){{end}}

-- noFreshBefore: no earlier row of the owed row's key is still in the outbox
-- (its transaction committed after this row was first claimed). The probe
-- starts at keyedFrom, past the key's rows deleted meanwhile, which a held
-- horizon keeps.
{{define "noFreshBefore"}}NOT EXISTS (SELECT 1 FROM {{.Table}} e WHERE e.key = {{.Owed}}.key AND e.id < {{.Owed}}.id
	  AND e.id > {{template "keyedFrom" "@fresh_keyed_floor"}}){{end}}

-- keyFree: no earlier row of row .Row's key is owed to the target in the
-- owed table: for a fresh row, and for a row the amqp walk took, so that it
-- goes to JetStream in the same batch.
{{define "keyFree"}}NOT EXISTS (
		SELECT 1 FROM {{.Owed}} e WHERE e.key = {{.Row}}.key AND e.id < {{.Row}}.id
		  AND e.{{.P}}_delivered_at IS NULL AND e.done_at IS NULL
		  AND (NOT @skip_parked_keys::boolean OR e.{{.P}}_parked_at IS NULL)){{end}}

-- freshHeads: the first row of each key among the outbox's oldest
-- @keyed_window keyed rows from keyedFrom, less the keys waiting for every
-- active target, topped up as heads does by a skip scan of key_order. From
-- keyedFrom, not @keyed_floor: a row the floor passed while its transaction
-- ran is its key's head once that ended, before the floor goes back.
{{define "freshHeads"}}WITH RECURSIVE window_keys AS MATERIALIZED (
		SELECT key, min(id) AS id, count(*) AS n FROM (
			SELECT id, key FROM {{.Table}} WHERE (@amqp_active::boolean OR @nats_active::boolean) AND key IS NOT NULL AND id > {{template "keyedFrom" "@keyed_floor"}}
			  AND NOT ({{template "keyWaits" .}})
			ORDER BY id LIMIT @keyed_window) r
		GROUP BY key
	), skip_scan(key, id, n) AS (
		SELECT k.key, k.id, 1 FROM (
			SELECT key, id FROM {{.Table}} WHERE key IS NOT NULL AND id > {{template "keyedFrom" "@keyed_floor"}} ORDER BY key, id LIMIT 1) k
		WHERE (@amqp_active::boolean OR @nats_active::boolean) AND (SELECT sum(n) >= @keyed_window AND count(*) * 4 < @keyed_window FROM window_keys)
		UNION ALL
		SELECT k.key, k.id, skip_scan.n + 1 FROM skip_scan CROSS JOIN LATERAL (
			SELECT key, id FROM {{.Table}} WHERE key IS NOT NULL AND key > skip_scan.key AND id > {{template "keyedFrom" "@keyed_floor"}} ORDER BY key, id LIMIT 1) k
		WHERE skip_scan.n < @keyed_rows * 2
	)
	SELECT id FROM window_keys
	UNION ALL
	SELECT id FROM skip_scan WHERE key NOT IN (SELECT key FROM window_keys) AND NOT ({{template "keyWaits" .}}){{end}}

-- keyWaits: the key waits for every active target.
{{define "keyWaits"}}(NOT @amqp_active::boolean OR key IN ({{template "waitingKeys" .AMQP}}))
			  AND (NOT @nats_active::boolean OR key IN ({{template "waitingKeys" .NATS}})){{end}}
