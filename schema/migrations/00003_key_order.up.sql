-- Per-key order: a keyed row is claimable for a target only while no
-- earlier row of its key is still owed to that target. These indexes answer
-- "is there an earlier pending row of this key?" with one probe.
CREATE INDEX {{.Name}}_amqp_key_pending ON {{.Table}} (key, id)
    WHERE key IS NOT NULL AND amqp_delivered_at IS NULL AND done_at IS NULL;
CREATE INDEX {{.Name}}_nats_key_pending ON {{.Table}} (key, id)
    WHERE key IS NOT NULL AND nats_delivered_at IS NULL AND done_at IS NULL;
