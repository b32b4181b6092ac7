-- Outgoing webhooks (docs/webhooks.md): the outbox, written with the facts, drained by the nodes.
-- Parameters are always bound (%(name)s).

-- name: webhook_emit
-- In the transaction of the facts it reports: one outbox row per event and endpoint subscribed to
-- its kind (events: a JSON array of {kind, type, data}). The subscriptions come as parameters,
-- from the config of the process that writes the fact.
INSERT INTO webhook_outbox (endpoint, type, payload)
SELECT w.endpoint, e.value->>'type',
       jsonb_build_object('type', e.value->>'type',
                          'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                          'data', e.value->'data')
  FROM jsonb_array_elements(%(events)s::jsonb) AS e
  JOIN unnest(%(wh_endpoints)s::text[], %(wh_kinds)s::text[]) AS w (endpoint, kind) ON w.kind = e.value->>'kind';

-- name: webhook_claim
-- Up to `limit` due events of one endpoint (not while a receiver has turned it off), leased: their
-- next attempt moves one lease ahead, so a node that dies mid-POST leaves them due again then.
WITH due AS (
    SELECT id FROM webhook_outbox
     WHERE endpoint = %(endpoint)s AND status = 'pending' AND next_attempt_at <= now()
       AND NOT EXISTS (SELECT FROM webhook_endpoints d WHERE d.id = %(endpoint)s AND d.disabled_at IS NOT NULL)
     ORDER BY next_attempt_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE webhook_outbox o
   SET attempts = o.attempts + 1, claim_token = %(claim_token)s,
       next_attempt_at = now() + make_interval(secs => %(lease)s)
  FROM due
 WHERE o.id = due.id
RETURNING o.id, o.msg_id, o.payload, o.attempts;

-- name: webhook_delivered
-- Delivered whoever holds the lease now: a node whose lease ran out still got it through.
UPDATE webhook_outbox
   SET status = 'delivered', done_at = now(), claim_token = NULL, last_status = %(status)s
 WHERE id = ANY (%(ids)s::bigint[]) AND status = 'pending';

-- name: webhook_failed
-- A failed POST, under its own lease only: the next attempt after the schedule's delay for this
-- attempt (the last delay repeats; never sooner than a Retry-After), moved back to max_age after
-- the event when that comes first, so the last attempt is made then; an attempt failing at or past
-- max_age makes the event dead, kept with its last error.
UPDATE webhook_outbox o
   SET claim_token = NULL, last_status = %(status)s, last_error = %(error)s,
       status = CASE WHEN now() >= o.created_at + make_interval(secs => %(max_age)s) THEN 'dead' ELSE 'pending' END,
       done_at = CASE WHEN now() >= o.created_at + make_interval(secs => %(max_age)s) THEN now() END,
       next_attempt_at = least(
           now() + make_interval(secs => greatest(
               (%(schedule)s::float8[])[least(o.attempts, cardinality(%(schedule)s::float8[]))]
                   * (1 + %(jitter)s::float8 * (2 * random() - 1)),
               coalesce(%(retry_after)s::float8, 0))),
           o.created_at + make_interval(secs => %(max_age)s))
 WHERE o.id = ANY (%(ids)s::bigint[]) AND o.claim_token = %(claim_token)s AND o.status = 'pending'
RETURNING o.id, o.status;

-- name: webhook_endpoint_disable
INSERT INTO webhook_endpoints (id, url, disabled_at, disabled_reason)
VALUES (%(endpoint)s, %(url)s, now(), %(reason)s)
ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, disabled_at = now(), disabled_reason = EXCLUDED.disabled_reason;

-- name: webhook_endpoint_enable
UPDATE webhook_endpoints SET disabled_at = NULL, disabled_reason = NULL
 WHERE id = %(endpoint)s AND disabled_at IS NOT NULL
RETURNING id;

-- name: webhook_prune
-- Delivered and dead events past their keep time go, a bounded number at a time; the pending
-- events of an endpoint a receiver turned off die once past max_age (they would never be tried).
WITH expired AS (
    UPDATE webhook_outbox
       SET status = 'dead', done_at = now(),
           last_error = 'endpoint disabled: ' || coalesce((SELECT disabled_reason FROM webhook_endpoints
                                                           WHERE id = %(endpoint)s), 'by its receiver')
     WHERE endpoint = %(endpoint)s AND status = 'pending'
       AND created_at < now() - make_interval(secs => %(max_age)s)
       AND EXISTS (SELECT FROM webhook_endpoints d WHERE d.id = %(endpoint)s AND d.disabled_at IS NOT NULL)
    RETURNING id
), old AS (
    -- SKIP LOCKED: several nodes prune the same endpoint without waiting on each other.
    SELECT id FROM webhook_outbox
     WHERE endpoint = %(endpoint)s AND status <> 'pending'
       AND ((status = 'delivered' AND done_at < now() - make_interval(secs => %(keep_delivered)s))
            OR (status = 'dead' AND done_at < now() - make_interval(secs => %(keep_dead)s)))
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM webhook_outbox o USING old WHERE o.id = old.id RETURNING o.id
)
SELECT (SELECT count(*) FROM gone) AS pruned, (SELECT count(*) FROM expired) AS expired;

-- name: webhook_counts
-- `webhooks ls`: per endpoint, events by status, the oldest pending and its disabled state.
SELECT o.endpoint,
       count(*) FILTER (WHERE o.status = 'pending') AS pending,
       count(*) FILTER (WHERE o.status = 'pending' AND o.attempts > 0) AS failing,
       count(*) FILTER (WHERE o.status = 'delivered') AS delivered,
       count(*) FILTER (WHERE o.status = 'dead') AS dead,
       min(o.created_at) FILTER (WHERE o.status = 'pending') AS oldest_pending
  FROM webhook_outbox o
 GROUP BY o.endpoint;

-- name: webhook_endpoints_disabled
SELECT id, url, disabled_at, disabled_reason FROM webhook_endpoints WHERE disabled_at IS NOT NULL;

-- name: webhook_failing
-- The latest events whose last attempt failed (retrying or dead), with the error.
SELECT id, 'msg_' || msg_id AS webhook_id, endpoint, type, status, attempts, last_status, last_error,
       created_at, CASE WHEN status = 'pending' THEN next_attempt_at END AS next_attempt_at
  FROM webhook_outbox
 WHERE last_error IS NOT NULL AND status IN ('pending', 'dead')
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: webhook_replay
-- Delivered or dead events back in line, due now, as they were (same id and body): one by its
-- outbox id or webhook-id, or all those that happened since a time. The attempts start anew, and
-- so does the max_age window (from the replay).
UPDATE webhook_outbox
   SET status = 'pending', next_attempt_at = now(), attempts = 0, done_at = NULL, claim_token = NULL,
       created_at = now(), last_status = NULL, last_error = NULL
 WHERE status IN ('delivered', 'dead')
   AND (id = %(id)s OR msg_id = %(msg_id)s OR created_at >= %(since)s)
RETURNING id, endpoint, type;
