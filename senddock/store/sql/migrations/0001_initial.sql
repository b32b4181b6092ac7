-- senddock schema, version 1.

CREATE TABLE subscribers (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email       text NOT NULL CHECK (email <> ''),
    name        text NOT NULL DEFAULT '',
    attributes  jsonb NOT NULL DEFAULT '{}',
    status      text NOT NULL DEFAULT 'active'
                CHECK (status IN ('active', 'unsubscribed', 'blocklisted')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
-- One subscriber per address, whatever its case.
CREATE UNIQUE INDEX subscribers_email_key ON subscribers (lower(email));

CREATE TABLE lists (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL CHECK (name <> ''),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX lists_name_key ON lists (lower(name));

CREATE TABLE list_members (
    list_id        bigint NOT NULL REFERENCES lists (id),
    subscriber_id  bigint NOT NULL REFERENCES subscribers (id),
    added_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (list_id, subscriber_id)
);
CREATE INDEX list_members_subscriber_idx ON list_members (subscriber_id);

CREATE TABLE campaigns (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text NOT NULL CHECK (name <> ''),
    subject        text NOT NULL,
    from_addr      text NOT NULL,
    reply_to       text,
    text_body      text,
    html_body      text,
    status         text NOT NULL DEFAULT 'draft'
                   CHECK (status IN ('draft', 'scheduled', 'sending', 'paused', 'cancelled', 'finished')),
    paused_reason  text,
    broadcast_id   bigint,
    send_at        timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    finished_at    timestamptz,
    CHECK (text_body IS NOT NULL OR html_body IS NOT NULL)
);

CREATE TABLE campaign_lists (
    campaign_id  bigint NOT NULL REFERENCES campaigns (id),
    list_id      bigint NOT NULL REFERENCES lists (id),
    PRIMARY KEY (campaign_id, list_id)
);

CREATE TABLE broadcasts (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id            bigint NOT NULL UNIQUE REFERENCES campaigns (id),
    enqueued               integer NOT NULL DEFAULT 0,
    skipped_suppressed     integer NOT NULL DEFAULT 0,
    skipped_unsubscribed   integer NOT NULL DEFAULT 0,
    created_at             timestamptz NOT NULL DEFAULT now(),
    finished_at            timestamptz
);
ALTER TABLE campaigns
    ADD CONSTRAINT campaigns_broadcast_fk FOREIGN KEY (broadcast_id) REFERENCES broadcasts (id);

-- The queue: one row per recipient of a broadcast, updated twice per row (claim, result).
-- A worker claims a small batch (one claim_token for the batch) and sends its jobs in id order,
-- committing each result before it starts the next send. So the lowest-id job of a batch still
-- 'sending' is the one whose send may have begun: that fact is durable without a write of its
-- own, and only that job is in doubt if the node dies; the others were never started.
-- No foreign keys: broadcasts and subscribers are never deleted, and the hot path should not pay
-- for a referential check per row or take share locks on the parents.
-- fillfactor leaves room on each page so a row's new version usually lands on the same page;
-- autovacuum runs early because every row leaves two dead versions behind.
CREATE TABLE broadcast_jobs (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    broadcast_id         bigint NOT NULL,
    subscriber_id        bigint NOT NULL,
    email                text NOT NULL,
    domain               text NOT NULL,
    status               text NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'sending', 'retry', 'sent', 'failed')),
    attempts             integer NOT NULL DEFAULT 0,
    rescues              integer NOT NULL DEFAULT 0,
    next_attempt_at      timestamptz NOT NULL DEFAULT now(),
    claimed_by           uuid,
    claimed_at           timestamptz,
    claim_token          uuid,
    first_attempt_at     timestamptz,
    provider_message_id  text,
    last_result          text,
    failure_reason       text,
    sent_at              timestamptz,
    UNIQUE (broadcast_id, subscriber_id)
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);
-- The claim indexes hold claimable rows only: sent and failed jobs leave them, so their size
-- follows the work left, not the history. Claims walk them per running broadcast: due retries
-- by due time, then pending jobs in enqueue order (next_attempt_at is the enqueue time).
CREATE INDEX broadcast_jobs_pending_idx
    ON broadcast_jobs (broadcast_id, next_attempt_at, id)
    WHERE status = 'pending';
CREATE INDEX broadcast_jobs_retry_idx
    ON broadcast_jobs (broadcast_id, next_attempt_at)
    WHERE status = 'retry';
-- In-flight jobs, by owner (recovery) and by broadcast (finishing a campaign); few rows at any time.
CREATE INDEX broadcast_jobs_sending_idx
    ON broadcast_jobs (claimed_by)
    WHERE status = 'sending';
CREATE INDEX broadcast_jobs_sending_broadcast_idx
    ON broadcast_jobs (broadcast_id)
    WHERE status = 'sending';

-- Every incarnation of a `senddock run` process. An incarnation holds the session advisory lock
-- (LOCK_CLASS, lock_id) on its lifeline connection for as long as it lives, so a lock that is
-- not granted in pg_locks proves the incarnation gone (pids are reused; locks are not).
CREATE TABLE nodes (
    id            uuid PRIMARY KEY,
    name          text NOT NULL,
    lock_id       integer GENERATED ALWAYS AS IDENTITY UNIQUE,
    host          text NOT NULL,
    pid           integer NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at    timestamptz
);
CREATE INDEX nodes_name_idx ON nodes (name);

-- Bounces whose on_bounced hooks have not all returned yet. Written in the transaction that
-- fails the job, deleted once the hooks ran; recovery runs the hooks again for what is left.
CREATE TABLE pending_bounces (
    job_id         bigint PRIMARY KEY,
    broadcast_id   bigint NOT NULL,
    campaign_id    bigint,
    email          text NOT NULL,
    code           integer,
    enhanced_code  text,
    diagnostic     text,
    node_id        uuid,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE suppressions (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email                text NOT NULL CHECK (email <> ''),
    reason               text NOT NULL CHECK (reason IN ('bounced', 'complained', 'unsubscribed', 'manual')),
    code                 text,
    diagnostic           text,
    source_broadcast_id  bigint,
    created_at           timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX suppressions_email_key ON suppressions (lower(email));

-- Append-only delivery log: every send attempt of every job, with what the server said.
CREATE TABLE delivery_attempts (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id         bigint NOT NULL,
    broadcast_id   bigint NOT NULL,
    attempt        integer NOT NULL,
    node           text,
    node_id        uuid,
    started_at     timestamptz,
    finished_at    timestamptz NOT NULL DEFAULT now(),
    outcome        text NOT NULL,
    in_doubt       boolean NOT NULL DEFAULT false,
    phase          text,
    smtp_code      integer,
    enhanced_code  text,
    message        text,
    provider_message_id  text,
    -- the worker had lost its claim when it recorded this (another node had taken the job)
    claim_lost     boolean NOT NULL DEFAULT false
);
CREATE INDEX delivery_attempts_job_idx ON delivery_attempts (job_id);
CREATE INDEX delivery_attempts_broadcast_idx ON delivery_attempts (broadcast_id);
