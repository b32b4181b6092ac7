-- senddock schema, version 12: outgoing webhooks (docs/webhooks.md).
--
-- The outbox: one row per event and endpoint, written in the transaction of the fact it reports
-- (a result, a bounce, an unsubscribe, a campaign finished or paused), delivered by the nodes.
-- A row is claimed by pushing its next_attempt_at one lease ahead under a fresh claim_token: a
-- node killed mid-POST leaves it due again once the lease has passed (delivered at least once).
CREATE TABLE webhook_outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    msg_id          uuid NOT NULL DEFAULT gen_random_uuid(),  -- webhook-id: msg_<msg_id>, the same on every retry
    endpoint        text NOT NULL,                            -- senddock.webhooks.settings.endpoint_id(url)
    type            text NOT NULL,                            -- message.sent, campaign.paused...
    payload         jsonb NOT NULL,                           -- {type, timestamp, data}
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0,
    claim_token     uuid,
    last_status     integer,                                  -- the receiver's HTTP status, if it answered
    last_error      text,
    done_at         timestamptz                               -- delivered or dead
);
-- Claims walk an endpoint's due rows; pruning and `webhooks ls` its finished ones.
CREATE INDEX webhook_outbox_due_idx ON webhook_outbox (endpoint, next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_outbox_done_idx ON webhook_outbox (endpoint, status, done_at) WHERE status <> 'pending';

-- Endpoints a receiver turned off (410 Gone): shared by every node, shown by `webhooks ls`,
-- cleared by `webhooks enable`.
CREATE TABLE webhook_endpoints (
    id              text PRIMARY KEY,
    url             text NOT NULL,  -- as shown: a password or query string masked
    disabled_at     timestamptz,
    disabled_reason text
);
