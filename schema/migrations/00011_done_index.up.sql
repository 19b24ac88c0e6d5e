-- +relayd no-transaction
-- The done index holds nothing since 00010. CONCURRENTLY takes no lock that
-- blocks writes: it waits for the transactions using the table to end.
DROP INDEX CONCURRENTLY IF EXISTS {{.Qualified "done"}};
