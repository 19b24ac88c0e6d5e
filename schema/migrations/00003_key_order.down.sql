DROP INDEX IF EXISTS {{.Qualified "amqp_key_pending"}};
DROP INDEX IF EXISTS {{.Qualified "nats_key_pending"}};
