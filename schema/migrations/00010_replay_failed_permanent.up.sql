-- `relayd replay` passes over a message RabbitMQ can never take (a routing
-- key over 255 bytes, headers it refuses) and counts it here. A column with
-- a constant default: no rewrite of the table.
ALTER TABLE {{.Qualified "replay"}} ADD COLUMN failed_permanent bigint NOT NULL DEFAULT 0;
