-- What comes back: provider events and inbound mail matched to jobs. Parameters are always bound (%(name)s).

-- name: event_job_by_message_id
SELECT j.id, j.broadcast_id, b.campaign_id, j.email
  FROM broadcast_jobs j JOIN broadcasts b ON b.id = j.broadcast_id
 WHERE j.provider_message_id = %(provider_message_id)s;

-- name: event_job_by_id
SELECT j.id, j.broadcast_id, b.campaign_id, j.email
  FROM broadcast_jobs j JOIN broadcasts b ON b.id = j.broadcast_id
 WHERE j.id = %(job_id)s;

-- name: event_record
-- Once per event_key; a second arrival returns the first row (new = false) with its hooks state.
-- DO UPDATE (a no-op) rather than DO NOTHING: two copies arriving at once both get the row back,
-- the second after the first commits. A job found only through its tag gets the provider's id it
-- missed (a crash after the send).
WITH recorded AS (
    INSERT INTO delivery_events (event_key, job_id, broadcast_id, provider_message_id, email, kind,
                                 bounce_type, sub_type, suppresses, diagnostic, occurred_at, about_recipient)
    VALUES (%(event_key)s, %(job_id)s, %(broadcast_id)s, %(provider_message_id)s, %(email)s, %(kind)s,
            %(bounce_type)s, %(sub_type)s, %(suppresses)s, %(diagnostic)s, %(occurred_at)s::timestamptz,
            %(about_recipient)s)
    ON CONFLICT (event_key) DO UPDATE SET event_key = EXCLUDED.event_key
    RETURNING id, hooks_done, xmax = 0 AS new
), found_id AS (
    UPDATE broadcast_jobs SET provider_message_id = %(provider_message_id)s
     WHERE id = %(job_id)s AND provider_message_id IS NULL AND %(provider_message_id)s::text IS NOT NULL
       AND EXISTS (SELECT FROM recorded WHERE new)
)
SELECT id, hooks_done, new FROM recorded;

-- name: event_hooks_done
UPDATE delivery_events SET hooks_done = true WHERE id = %(event_id)s;

-- name: soft_bounces_recent
-- The soft-bounce policy (bounces.soft): the other messages of an address that bounced soft about
-- the mailbox within the window (when they bounced, as their reports say, else when we heard),
-- since its latest delivery. One per job: the same message reported twice bounced once.
SELECT count(DISTINCT coalesce(e.job_id, -e.id))
  FROM delivery_events e
 WHERE lower(e.email) = lower(%(email)s) AND e.kind = 'bounce' AND e.bounce_type = 'Transient'
   AND e.about_recipient AND e.job_id IS DISTINCT FROM %(job_id)s
   AND coalesce(e.occurred_at, e.received_at) > now() - make_interval(secs => %(window)s)
   AND coalesce(e.occurred_at, e.received_at)
       > coalesce((SELECT max(coalesce(d.occurred_at, d.received_at)) FROM delivery_events d
                    WHERE lower(d.email) = lower(%(email)s) AND d.kind = 'delivery'), '-infinity');

-- name: inbound_mail_seen
SELECT outcome FROM inbound_mail WHERE mail_key = %(mail_key)s;

-- name: inbound_mail_record
-- Once per message: a replay (the same key) keeps the first row.
INSERT INTO inbound_mail (mail_key, via, origin, kind, outcome, job_id, broadcast_id, recipients, status,
                          reason, size)
VALUES (%(mail_key)s, %(via)s, %(origin)s, %(kind)s, %(outcome)s, %(job_id)s, %(broadcast_id)s,
        %(recipients)s, %(status)s, %(reason)s, %(size)s)
ON CONFLICT (mail_key) DO NOTHING;
