-- senddock schema, version 5: breakers that stop a campaign before a relay's fault damages a list.

-- Retries that do not use up the recipient's retries (throttling, relay trouble): counted apart,
-- so their backoff still grows while `attempts` says how often the recipient was really tried.
ALTER TABLE broadcast_jobs ADD COLUMN deferrals integer NOT NULL DEFAULT 0;

-- A pause for relay trouble resumes by itself once a probe of the relay succeeds (auto_resume,
-- probed at probe_at with backoff); a pause a person must judge (bounce rate, authentication,
-- policy) does not. bounce_window_from: the first delivery_attempts id of the results that tripped
-- the bounce-rate breaker, so `campaign unsuppress --since-pause` can undo what that window did;
-- bounce_count_from: the breaker counts results from this attempt id on (a person who resumed
-- after judging the bounces real starts it afresh).
ALTER TABLE campaigns
    ADD COLUMN paused_at           timestamptz,
    ADD COLUMN auto_resume         boolean NOT NULL DEFAULT false,
    ADD COLUMN probe_at            timestamptz,
    ADD COLUMN probes              integer NOT NULL DEFAULT 0,
    ADD COLUMN probe_result        text,
    ADD COLUMN bounce_window_from  bigint,
    ADD COLUMN bounce_count_from   bigint NOT NULL DEFAULT 0;
CREATE INDEX campaigns_probe_idx ON campaigns (probe_at) WHERE status = 'paused' AND auto_resume;

-- The bounce-rate breaker reads a broadcast's last (and first) results in id order.
DROP INDEX delivery_attempts_broadcast_idx;
CREATE INDEX delivery_attempts_broadcast_idx ON delivery_attempts (broadcast_id, id);
