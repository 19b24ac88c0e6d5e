-- +relayd no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{.Name}}_done ON {{.Table}} (done_at) WHERE done_at IS NOT NULL;
