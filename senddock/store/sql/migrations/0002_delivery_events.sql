-- senddock schema, version 2: what providers tell us after the send (bounces, complaints,
-- deliveries from SES/SNS notifications), and finding a job by the provider's message id.

-- Each event once: applying the same notifications twice changes nothing the second time. The
-- hooks (on_bounced: suppression) run after the commit; hooks_done turns true once they all
-- returned, so a crash in between re-runs them when the event arrives again.
CREATE TABLE delivery_events (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_key            text NOT NULL UNIQUE,
    job_id               bigint,
    broadcast_id         bigint,
    provider_message_id  text,
    email                text NOT NULL,
    kind                 text NOT NULL CHECK (kind IN ('bounce', 'complaint', 'delivery')),
    bounce_type          text,   -- Permanent, Transient, Undetermined
    sub_type             text,   -- General, NoEmail, Suppressed, OnAccountSuppressionList, MailboxFull...
    suppresses           boolean NOT NULL,
    diagnostic           text,
    occurred_at          timestamptz,
    received_at          timestamptz NOT NULL DEFAULT now(),
    hooks_done           boolean NOT NULL DEFAULT false
);
CREATE INDEX delivery_events_job_idx ON delivery_events (job_id);

-- Only API transports set it: SMTP jobs (NULL) add nothing to this index.
CREATE INDEX broadcast_jobs_provider_message_id_idx
    ON broadcast_jobs (provider_message_id)
    WHERE provider_message_id IS NOT NULL;
