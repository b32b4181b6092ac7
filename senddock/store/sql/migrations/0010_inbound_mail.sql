-- senddock schema, version 10: what comes back by mail (bounces receive, fetch, ingest).
--
-- One row per message read, whatever it turned out to be, so every outcome is counted and a
-- message that arrives again (a relay retrying after a crash, the same DSN in a mailbox and at the
-- receiver) is known as a replay. What a bounce does to its job goes, as for SES, into
-- delivery_events.
CREATE TABLE inbound_mail (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    mail_key      text NOT NULL UNIQUE,  -- its Message-ID with the job it names, else a hash of its bytes
    via           text NOT NULL CHECK (via IN ('receive', 'fetch', 'ingest')),
    origin        text,                  -- a path#n, a mailbox message, the SMTP client
    kind          text NOT NULL CHECK (kind IN ('hard', 'soft', 'complaint', 'auto_reply', 'not_bounce')),
    -- applied: recorded against its job; the others suppress nobody.
    outcome       text NOT NULL CHECK (outcome IN ('applied', 'ignored', 'forged', 'unattributed',
                                                   'unknown_job', 'address_mismatch', 'too_large')),
    job_id        bigint,
    broadcast_id  bigint,
    recipients    text[] NOT NULL DEFAULT '{}',
    status        text,
    reason        text,
    size          integer NOT NULL,
    received_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inbound_mail_broadcast_idx ON inbound_mail (broadcast_id) WHERE broadcast_id IS NOT NULL;

-- The soft-bounce policy counts an address's recent soft bounces and deliveries. A transient
-- bounce that refused our message (content, size, policy) says nothing about the address: it is
-- recorded and never counted.
ALTER TABLE delivery_events ADD COLUMN about_recipient boolean NOT NULL DEFAULT true;
CREATE INDEX delivery_events_email_idx ON delivery_events (lower(email), received_at);
-- Campaign status and the bounce-rate breaker read a broadcast's events after the send.
CREATE INDEX delivery_events_broadcast_idx ON delivery_events (broadcast_id, job_id);
