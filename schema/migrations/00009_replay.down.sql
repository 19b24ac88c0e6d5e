DROP TABLE {{.Qualified "replay"}};
