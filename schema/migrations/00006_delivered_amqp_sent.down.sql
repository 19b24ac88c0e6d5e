DROP INDEX {{.Qualified "delivered_message_id"}};
CREATE INDEX {{.Name}}_delivered_message_id ON {{.Qualified "delivered"}} (message_id);
ALTER TABLE {{.Qualified "delivered"}} DROP COLUMN amqp_sent;
