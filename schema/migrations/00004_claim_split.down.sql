DROP INDEX {{.Qualified "amqp_key_waiting"}};
DROP INDEX {{.Qualified "nats_key_waiting"}};
DROP INDEX {{.Qualified "amqp_keyed_pending"}};
DROP INDEX {{.Qualified "nats_keyed_pending"}};
DROP INDEX {{.Qualified "amqp_pending"}};
DROP INDEX {{.Qualified "nats_pending"}};
CREATE INDEX {{.Name}}_amqp_pending ON {{.Table}} (id)
    WHERE amqp_delivered_at IS NULL AND amqp_parked_at IS NULL AND done_at IS NULL;
CREATE INDEX {{.Name}}_nats_pending ON {{.Table}} (id)
    WHERE nats_delivered_at IS NULL AND nats_parked_at IS NULL AND done_at IS NULL;
