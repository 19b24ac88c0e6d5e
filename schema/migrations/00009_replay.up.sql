-- `relayd replay`'s runs: the window of the stream it publishes back to the
-- legacy exchange after the nats-only phase, and how far it got. position is
-- the stream sequence up to which every message is confirmed by RabbitMQ or
-- skipped, so a rerun after a crash resumes past it (docs/migration.md,
-- "Rolling back: relayd replay"). One run at a time may be unfinished.
CREATE TABLE {{.Qualified "replay"}} (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream             text        NOT NULL,
    exchange           text        NOT NULL,
    -- What was asked for ("phase", "since", "seq"), as the rerun compares it.
    request            text        NOT NULL,
    window_start       timestamptz NULL,
    window_end         timestamptz NULL,
    from_seq           bigint      NOT NULL,
    to_seq             bigint      NOT NULL,
    position           bigint      NOT NULL,
    sent               bigint      NOT NULL DEFAULT 0,
    skipped_delivered  bigint      NOT NULL DEFAULT 0,
    skipped_backfilled bigint      NOT NULL DEFAULT 0,
    skipped_owed       bigint      NOT NULL DEFAULT 0,
    without_id         bigint      NOT NULL DEFAULT 0,
    other_subject      bigint      NOT NULL DEFAULT 0,
    -- Messages RabbitMQ can never take (a routing key over 255 bytes,
    -- headers it refuses), passed over as the relay would park them.
    failed_permanent   bigint      NOT NULL DEFAULT 0,
    started_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz NULL,
    abandoned          boolean     NOT NULL DEFAULT false
);
CREATE UNIQUE INDEX {{.Name}}_replay_unfinished ON {{.Qualified "replay"}} ((true)) WHERE finished_at IS NULL;
