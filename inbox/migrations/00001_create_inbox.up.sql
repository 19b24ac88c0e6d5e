-- The inbox: one row per message id a consumer group has processed, written
-- in the same transaction as the handler's own changes (see package inbox).
CREATE TABLE {{.Table}} (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    source      text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT {{.Name}}_pkey PRIMARY KEY (consumer, message_id),
    CONSTRAINT {{.Name}}_message_id_check CHECK (message_id <> ''),
    CONSTRAINT {{.Name}}_source_check CHECK (source IN ('amqp', 'nats'))
);

-- Retention deletes each consumer group's oldest rows.
CREATE INDEX {{.Name}}_received_at ON {{.Table}} (consumer, received_at);

-- Every row is deleted after the retention period: vacuum early and often.
ALTER TABLE {{.Table}} SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02
);
