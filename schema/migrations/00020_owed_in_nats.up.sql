-- +relayd no-transaction
-- The owed rows JetStream has: in dual write, rows waiting for RabbitMQ; in
-- the nats-only phase, only the stranded ones the cleanup finishes
-- (docs/design.md, "Stranded rows"), found here rather than in a walk of
-- the whole owed table, whose dead rows a held horizon keeps. CONCURRENTLY
-- blocks no writes; a build that failed leaves an invalid index of this
-- name, which goes first.
DROP INDEX CONCURRENTLY IF EXISTS {{.Qualified "owed_in_nats"}};
CREATE INDEX CONCURRENTLY {{.Name}}_owed_in_nats ON {{.Qualified "owed"}} (id)
    WHERE nats_delivered_at IS NOT NULL AND done_at IS NULL;
