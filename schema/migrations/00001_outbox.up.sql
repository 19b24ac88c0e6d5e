-- The outbox table: a public contract. Producers in any language INSERT rows;
-- relayd claims, publishes and records them. See docs/producers.md, "The SQL contract".
CREATE TABLE {{.Table}} (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id        uuid        NOT NULL DEFAULT gen_random_uuid(),
    topic             text        NOT NULL,
    key               text        NULL,
    headers           jsonb       NULL,
    payload           bytea       NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),

    -- Delivery state, one set of columns per broker (written by relayd only).
    amqp_delivered_at timestamptz NULL,
    amqp_attempts     integer     NOT NULL DEFAULT 0,
    amqp_retry_at     timestamptz NULL,
    amqp_parked_at    timestamptz NULL,
    amqp_last_error   text        NULL,
    nats_delivered_at timestamptz NULL,
    nats_attempts     integer     NOT NULL DEFAULT 0,
    nats_retry_at     timestamptz NULL,
    nats_parked_at    timestamptz NULL,
    nats_last_error   text        NULL,
    -- Set when the row reached every target enabled at the time; rows are
    -- deleted RELAY_RETENTION after done_at.
    done_at           timestamptz NULL,

    CONSTRAINT {{.Name}}_message_id_key UNIQUE (message_id),
    CONSTRAINT {{.Name}}_topic_check CHECK (topic <> ''),
    CONSTRAINT {{.Name}}_headers_check CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object')
);

-- Claim indexes: one per target, holding only rows still to send to it, so a
-- claim never walks past rows another target is still waiting for.
CREATE INDEX {{.Name}}_amqp_pending ON {{.Table}} (id)
    WHERE amqp_delivered_at IS NULL AND amqp_parked_at IS NULL AND done_at IS NULL;
CREATE INDEX {{.Name}}_nats_pending ON {{.Table}} (id)
    WHERE nats_delivered_at IS NULL AND nats_parked_at IS NULL AND done_at IS NULL;
-- Retention deletes by done_at.
CREATE INDEX {{.Name}}_done ON {{.Table}} (done_at) WHERE done_at IS NOT NULL;
-- Parked rows, for operators and the parked gauge.
CREATE INDEX {{.Name}}_parked ON {{.Table}} (id)
    WHERE amqp_parked_at IS NOT NULL OR nats_parked_at IS NOT NULL;

-- A queue table: vacuum it early and often.
ALTER TABLE {{.Table}} SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Wake idle relays: one NOTIFY per INSERT statement (not per row), folded per
-- transaction and delivered at commit. Plain-SQL producers get it for free.
CREATE FUNCTION {{.Qualified "notify"}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;
CREATE TRIGGER {{.Name}}_notify AFTER INSERT ON {{.Table}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Qualified "notify"}}('{{.Channel}}');
