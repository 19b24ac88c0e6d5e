ALTER TABLE {{.Qualified "owed"}}
    DROP COLUMN amqp_exchange,
    DROP COLUMN amqp_routing_key,
    DROP COLUMN nats_subject,
    DROP COLUMN nats_stream;
