-- Claims walk keyed and unkeyed rows separately, so that neither walks past
-- the other: the pending indexes now hold unkeyed rows only, the keyed_pending
-- indexes the keyed ones (each row is in exactly one, as before), and the
-- key_waiting indexes the few keyed rows waiting for a retry or parked,
-- whose keys are held. Building them locks out writes to the table for the
-- time it takes: run this migration at a quiet moment on a large outbox.
DROP INDEX {{.Qualified "amqp_pending"}};
DROP INDEX {{.Qualified "nats_pending"}};
CREATE INDEX {{.Name}}_amqp_pending ON {{.Table}} (id)
    WHERE key IS NULL AND amqp_delivered_at IS NULL AND amqp_parked_at IS NULL AND done_at IS NULL;
CREATE INDEX {{.Name}}_nats_pending ON {{.Table}} (id)
    WHERE key IS NULL AND nats_delivered_at IS NULL AND nats_parked_at IS NULL AND done_at IS NULL;
CREATE INDEX {{.Name}}_amqp_keyed_pending ON {{.Table}} (id)
    WHERE key IS NOT NULL AND amqp_delivered_at IS NULL AND amqp_parked_at IS NULL AND done_at IS NULL;
CREATE INDEX {{.Name}}_nats_keyed_pending ON {{.Table}} (id)
    WHERE key IS NOT NULL AND nats_delivered_at IS NULL AND nats_parked_at IS NULL AND done_at IS NULL;
CREATE INDEX {{.Name}}_amqp_key_waiting ON {{.Table}} (key)
    WHERE key IS NOT NULL AND amqp_delivered_at IS NULL AND done_at IS NULL
      AND (amqp_retry_at IS NOT NULL OR amqp_parked_at IS NOT NULL);
CREATE INDEX {{.Name}}_nats_key_waiting ON {{.Table}} (key)
    WHERE key IS NOT NULL AND nats_delivered_at IS NULL AND done_at IS NULL
      AND (nats_retry_at IS NOT NULL OR nats_parked_at IS NOT NULL);
