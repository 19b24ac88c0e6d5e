-- Rows delivered since the upgrade are gone from the outbox; their record
-- goes with this table.
DROP TABLE IF EXISTS {{.Qualified "delivered"}};
