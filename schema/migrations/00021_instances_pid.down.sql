ALTER TABLE {{.Qualified "instances"}} DROP COLUMN pid;
