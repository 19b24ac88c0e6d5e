-- Checks every row of the outbox, holding it locked meanwhile.
ALTER TABLE {{.Table}}
    ADD CONSTRAINT {{.Name}}_topic_check CHECK (topic <> ''),
    ADD CONSTRAINT {{.Name}}_headers_check CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object');
