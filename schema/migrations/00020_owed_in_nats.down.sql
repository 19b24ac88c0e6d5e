-- +relayd no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {{.Qualified "owed_in_nats"}};
