ALTER TABLE {{.Qualified "replay"}} DROP COLUMN failed_permanent;
