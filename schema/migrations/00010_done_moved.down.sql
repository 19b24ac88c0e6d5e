-- The moved rows stay in the delivered table, which relayd reads as it read
-- them in the outbox: their payloads are gone, so there is nothing to move back.
SELECT 1;
