DROP TABLE IF EXISTS {{.Qualified "backfilled"}};
