DROP TABLE IF EXISTS {{.Table}};
DROP FUNCTION IF EXISTS {{.Qualified "notify"}}();
