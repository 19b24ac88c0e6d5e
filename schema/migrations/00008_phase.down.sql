DROP TABLE {{.Qualified "instances"}};
DROP TABLE {{.Qualified "phase_history"}};
DROP TABLE {{.Qualified "phase"}};
