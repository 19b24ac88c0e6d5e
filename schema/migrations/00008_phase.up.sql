-- The migration phase, shared by every relay of this outbox
-- (docs/migration.md, "The phases"). One row once `relayd phase set` has
-- run; until then each relay runs RELAY_TARGETS, or both targets. Relays
-- that follow the table read it every few seconds.
CREATE TABLE {{.Qualified "phase"}} (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    phase      text        NOT NULL CHECK (phase IN ('amqp', 'dual', 'nats')),
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text        NOT NULL,
    reason     text        NOT NULL DEFAULT ''
);

-- Every change, oldest first: `relayd replay` reads when the nats-only phase
-- began and ended.
CREATE TABLE {{.Qualified "phase_history"}} (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    phase      text        NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text        NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    forced     boolean     NOT NULL DEFAULT false
);

-- The running relays, each writing its row every few seconds: the phase it
-- runs and whether RELAY_TARGETS pins it. `relayd status` lists them and
-- `cutover check` fails on one whose phase is not the table's.
CREATE TABLE {{.Qualified "instances"}} (
    instance   text        PRIMARY KEY,
    phase      text        NOT NULL,
    pinned     boolean     NOT NULL,
    version    text        NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL DEFAULT now()
);
