ALTER TABLE {{.Qualified "replay"}} DROP COLUMN stream_created;
