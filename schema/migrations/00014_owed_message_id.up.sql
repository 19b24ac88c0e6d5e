-- +relayd no-transaction
-- The owed table's message ids, for late confirms and the backfill's and
-- replay's lookups, without 00013's unique constraint: a producer may insert
-- again the id of a row that moved there. CONCURRENTLY blocks no writes; a
-- build that failed (cancelled, or relayd stopped) leaves an invalid index
-- of this name, which goes first. Dropping the constraint locks the owed
-- table, the relays' only, for milliseconds.
DROP INDEX CONCURRENTLY IF EXISTS {{.Qualified "owed_message_id"}};
CREATE INDEX CONCURRENTLY {{.Name}}_owed_message_id ON {{.Qualified "owed"}} (message_id);
ALTER TABLE {{.Qualified "owed"}} DROP CONSTRAINT IF EXISTS {{.Name}}_owed_message_id_key;
