-- Campaigns and their broadcasts: drafts, enqueueing, control, status and the delivery log. Parameters are always bound (%(name)s).

-- name: campaign_create
INSERT INTO campaigns (name, subject, from_addr, reply_to, text_body, html_body, send_rate)
VALUES (%(name)s, %(subject)s, %(from_addr)s, %(reply_to)s, %(text_body)s, %(html_body)s, %(send_rate)s)
RETURNING id;

-- name: campaign_add_list
INSERT INTO campaign_lists (campaign_id, list_id) VALUES (%(campaign_id)s, %(list_id)s)
ON CONFLICT DO NOTHING;

-- name: campaign_get
SELECT c.id, c.name, c.subject, c.from_addr, c.reply_to, c.text_body, c.html_body, c.status,
       c.paused_reason, c.broadcast_id, c.send_at, c.created_at, c.started_at, c.finished_at,
       c.paused_at, c.auto_resume, c.probe_at, c.probes, c.probe_result, c.bounce_window_from,
       c.send_rate, coalesce(array_agg(l.name ORDER BY l.name) FILTER (WHERE l.id IS NOT NULL), '{}') AS lists,
       c.pruned_at, c.final_counts
FROM campaigns c
LEFT JOIN campaign_lists cl ON cl.campaign_id = c.id
LEFT JOIN lists l ON l.id = cl.list_id
WHERE c.id = %(campaign_id)s
GROUP BY c.id;

-- name: campaign_events
-- Its latest status changes, newest first (a pause: when, why and from which kind of session).
SELECT id, at, from_status, to_status, reason, auto_resume, actor
FROM campaign_events
WHERE campaign_id = %(campaign_id)s
ORDER BY id DESC
LIMIT %(limit)s;

-- name: campaign_all
SELECT c.id, c.name, c.subject, c.status, c.broadcast_id, c.send_at, c.created_at, c.started_at,
       c.finished_at, b.enqueued, c.send_rate,
       coalesce(array_agg(l.name ORDER BY l.name) FILTER (WHERE l.id IS NOT NULL), '{}') AS lists
FROM campaigns c
LEFT JOIN broadcasts b ON b.id = c.broadcast_id
LEFT JOIN campaign_lists cl ON cl.campaign_id = c.id
LEFT JOIN lists l ON l.id = cl.list_id
GROUP BY c.id, b.id
ORDER BY c.id;

-- name: campaign_lock
SELECT id, status, broadcast_id FROM campaigns WHERE id = %(campaign_id)s FOR UPDATE;

-- name: campaign_update_content
-- `campaign edit`: only a draft (the row is locked by campaign_lock first, so a concurrent
-- `campaign send` either sent it before, and this changes nothing, or waits for this to commit).
UPDATE campaigns
   SET name = %(name)s, subject = %(subject)s, from_addr = %(from_addr)s, reply_to = %(reply_to)s,
       text_body = %(text_body)s, html_body = %(html_body)s, send_rate = %(send_rate)s, updated_at = now()
 WHERE id = %(campaign_id)s AND status = 'draft'
RETURNING id;

-- name: campaign_set_rate
-- `campaign set-rate`: any campaign with sends still to come (a draft, scheduled, sending or
-- paused). Not a status change: campaign_events does not record it. The old value is read under
-- the row lock, so two set-rates at once each report the rate they replaced.
UPDATE campaigns c SET send_rate = %(send_rate)s, updated_at = now()
  FROM (SELECT id, send_rate FROM campaigns WHERE id = %(campaign_id)s FOR UPDATE) before
 WHERE c.id = before.id AND c.status NOT IN ('finished', 'cancelled')
RETURNING c.status, before.send_rate AS before;

-- name: campaign_lists_clear
DELETE FROM campaign_lists WHERE campaign_id = %(campaign_id)s;

-- name: campaign_clone
-- A new draft with the content, rate and lists of any campaign (a sent one too: to send a fixed version).
WITH source AS (
    SELECT id, name, subject, from_addr, reply_to, text_body, html_body, send_rate
    FROM campaigns WHERE id = %(campaign_id)s
), created AS (
    INSERT INTO campaigns (name, subject, from_addr, reply_to, text_body, html_body, send_rate)
    SELECT coalesce(%(name)s, name || ' (copy)'), subject, from_addr, reply_to, text_body, html_body, send_rate
    FROM source
    RETURNING id
), linked AS (
    INSERT INTO campaign_lists (campaign_id, list_id)
    SELECT c.id, cl.list_id FROM created c, campaign_lists cl WHERE cl.campaign_id = %(campaign_id)s
)
SELECT id FROM created;

-- name: campaign_delete_counts
-- What deleting a campaign would remove (and keep), read under its row lock. Bounces not yet
-- applied (a pending bounce's hooks, a suppressing provider event whose hooks failed) would lose
-- their suppression with their job: the delete waits for them.
SELECT (SELECT count(*) FROM campaign_lists WHERE campaign_id = %(campaign_id)s) AS lists,
       (SELECT count(*) FROM broadcast_jobs WHERE broadcast_id = %(broadcast_id)s) AS jobs,
       (SELECT count(*) FROM broadcast_jobs WHERE broadcast_id = %(broadcast_id)s AND status = 'sent') AS sent,
       (SELECT count(*) FROM broadcast_jobs WHERE broadcast_id = %(broadcast_id)s AND status = 'sending') AS in_flight,
       (SELECT count(*) FROM delivery_attempts WHERE broadcast_id = %(broadcast_id)s) AS delivery_attempts,
       (SELECT count(*) FROM delivery_events WHERE broadcast_id = %(broadcast_id)s) AS delivery_events,
       (SELECT count(*) FROM pending_bounces WHERE broadcast_id = %(broadcast_id)s)
       + (SELECT count(*) FROM delivery_events
           WHERE broadcast_id = %(broadcast_id)s AND suppresses AND NOT hooks_done) AS unapplied_bounces,
       (SELECT count(*) FROM suppressions WHERE source_broadcast_id = %(broadcast_id)s) AS suppressions_kept;

-- name: campaign_delete
-- One statement: the campaign, its list links and status history, its broadcast and everything keyed by the broadcast
-- (no foreign keys on the queue's tables, so nothing else would remove them). The foreign keys
-- between campaigns and broadcasts point both ways; both rows go in this statement, and the checks
-- run at its end. Suppressions its bounces made are kept: they protect the list, whatever became
-- of the campaign. So are the inbound_mail rows of its bounces by mail: a message read is known
-- as read, and arriving again it is a replay. in_flight counts deleted jobs that were being sent (re-read after any claim
-- that held them committed): the caller rolls back when it is not 0.
WITH lists AS (
    DELETE FROM campaign_lists WHERE campaign_id = %(campaign_id)s RETURNING 1
), jobs AS (
    DELETE FROM broadcast_jobs WHERE broadcast_id = %(broadcast_id)s RETURNING status
), attempts AS (
    DELETE FROM delivery_attempts WHERE broadcast_id = %(broadcast_id)s RETURNING 1
), events AS (
    DELETE FROM delivery_events WHERE broadcast_id = %(broadcast_id)s RETURNING 1
), floors AS (
    DELETE FROM claim_floors WHERE broadcast_id = %(broadcast_id)s RETURNING 1
), putbacks AS (
    DELETE FROM claim_putbacks WHERE broadcast_id = %(broadcast_id)s RETURNING 1
), history AS (
    -- Would go by ON DELETE CASCADE too; deleted here to be counted.
    DELETE FROM campaign_events WHERE campaign_id = %(campaign_id)s RETURNING 1
), broadcast AS (
    DELETE FROM broadcasts WHERE id = %(broadcast_id)s RETURNING 1
), campaign AS (
    DELETE FROM campaigns WHERE id = %(campaign_id)s RETURNING 1
)
SELECT (SELECT count(*) FROM campaign) AS campaigns,
       (SELECT count(*) FROM lists) AS lists,
       (SELECT count(*) FROM broadcast) AS broadcasts,
       (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM jobs WHERE status = 'sending') AS in_flight,
       (SELECT count(*) FROM attempts) AS delivery_attempts,
       (SELECT count(*) FROM events) AS delivery_events,
       (SELECT count(*) FROM floors) + (SELECT count(*) FROM putbacks) AS claim_floors,
       (SELECT count(*) FROM history) AS campaign_events;

-- name: campaign_list_ids
SELECT list_id FROM campaign_lists WHERE campaign_id = %(campaign_id)s;

-- name: broadcast_create
INSERT INTO broadcasts (campaign_id) VALUES (%(campaign_id)s) RETURNING id;

-- name: broadcast_enqueue
-- One set-based statement: every active, non-suppressed member of the campaign's lists becomes a
-- pending job; the others are counted as skipped.
WITH members AS MATERIALIZED (
    SELECT s.id, s.email, s.status, x.id IS NOT NULL AS suppressed
    FROM subscribers s
    LEFT JOIN suppressions x ON lower(x.email) = lower(s.email)
    WHERE EXISTS (SELECT 1 FROM list_members m
                  WHERE m.subscriber_id = s.id AND m.list_id = ANY(%(list_ids)s))
), enqueued AS (
    INSERT INTO broadcast_jobs (broadcast_id, subscriber_id, email, domain)
    SELECT %(broadcast_id)s, id, email, lower(split_part(email, '@', 2))
    FROM members
    WHERE status = 'active' AND NOT suppressed
    RETURNING 1
)
-- An unsubscribed or blocklisted subscriber is suppressed too: counted by their status, so that
-- "suppressed" means the suppression list alone (bounces, complaints, an operator's word).
SELECT (SELECT count(*) FROM enqueued) AS enqueued,
       count(*) FILTER (WHERE suppressed AND status = 'active') AS skipped_suppressed,
       count(*) FILTER (WHERE status <> 'active') AS skipped_unsubscribed
FROM members;

-- name: broadcast_record_counts
UPDATE broadcasts
   SET enqueued = %(enqueued)s,
       skipped_suppressed = %(skipped_suppressed)s,
       skipped_unsubscribed = %(skipped_unsubscribed)s,
       finished_at = CASE WHEN %(enqueued)s = 0 THEN now() END
 WHERE id = %(broadcast_id)s;

-- name: campaign_start
-- One sent for later waits 'scheduled' (its jobs are enqueued now, so the count is known; nothing
-- claims them before send_at). A broadcast with nobody to send to never gets here (send_campaign
-- refuses it and the campaign stays a draft): the 'finished' branch is a guard only.
UPDATE campaigns
   SET status = CASE WHEN %(enqueued)s = 0 THEN 'finished'
                     WHEN %(send_at)s::timestamptz > now() THEN 'scheduled'
                     ELSE 'sending' END,
       broadcast_id = %(broadcast_id)s,
       send_at = %(send_at)s::timestamptz,
       started_at = CASE WHEN %(send_at)s::timestamptz > now() THEN NULL ELSE now() END,
       finished_at = CASE WHEN %(enqueued)s = 0 THEN now() END,
       updated_at = now()
 WHERE id = %(campaign_id)s;

-- name: broadcast_counts
-- One statement, so one short snapshot per refresh of `campaign status --watch` (and the failures
-- by reason add up to the failed count without a REPEATABLE READ transaction around two queries).
-- The jobs' counts come from the tallies (migration 11: kept by the jobs' own statements, exact at
-- any snapshot), not from counting the broadcast's jobs: a few rows, however large the broadcast.
-- json, not jsonb: it keeps the reasons in this order, most frequent first.
WITH jobs AS (
    SELECT t.key[2] AS status, t.key[3] AS reason, sum(t.n) AS n
      FROM tallies t
     WHERE t.subject = 'jobs' AND t.key[1] = %(broadcast_id)s::bigint::text
     GROUP BY 1, 2
    HAVING sum(t.n) <> 0
)
SELECT b.enqueued AS total,
       b.skipped_suppressed + b.skipped_unsubscribed AS skipped,
       (SELECT coalesce(sum(n), 0) FROM jobs WHERE status = 'pending')::bigint AS pending,
       (SELECT coalesce(sum(n), 0) FROM jobs WHERE status = 'sending')::bigint AS sending,
       (SELECT coalesce(sum(n), 0) FROM jobs WHERE status = 'retry')::bigint AS retry,
       (SELECT coalesce(sum(n), 0) FROM jobs WHERE status = 'sent')::bigint AS sent,
       (SELECT coalesce(sum(n), 0) FROM jobs WHERE status = 'failed')::bigint AS failed,
       (SELECT coalesce(sum(n), 0) FROM jobs WHERE status = 'failed' AND reason = 'bounced')::bigint AS bounced,
       -- What came back after the send (SES notifications, bounces by mail), one per job: hard
       -- (a permanent bounce), soft (the others, unless the job also bounced hard), complaints.
       (SELECT count(DISTINCT e.job_id) FROM delivery_events e
         WHERE e.broadcast_id = b.id AND e.kind = 'bounce' AND e.bounce_type = 'Permanent'
           AND NOT EXISTS (SELECT FROM broadcast_jobs x WHERE x.id = e.job_id AND x.status = 'failed'
                                                         AND x.failure_reason = 'bounced')) AS later_hard,
       (SELECT count(DISTINCT e.job_id) FROM delivery_events e
         WHERE e.broadcast_id = b.id AND e.kind = 'bounce' AND e.bounce_type IS DISTINCT FROM 'Permanent'
           AND NOT EXISTS (SELECT FROM delivery_events h WHERE h.job_id = e.job_id AND h.kind = 'bounce'
                                                           AND h.bounce_type = 'Permanent')) AS later_soft,
       (SELECT count(DISTINCT e.job_id) FROM delivery_events e
         WHERE e.broadcast_id = b.id AND e.kind = 'complaint') AS complaints,
       (SELECT coalesce(json_object_agg(r.reason, r.n ORDER BY r.n DESC, r.reason), '{}')
          FROM jobs r WHERE r.status = 'failed') AS failed_by_reason
FROM broadcasts b
WHERE b.id = %(broadcast_id)s;

-- name: campaign_unsuppress
-- Undo what a campaign's bounces did: the suppressions its broadcast made (from the bounce-rate
-- window with since_pause, else all of them) are removed, their held hooks dropped, and their jobs
-- put back in line as due retries (attempts stay counted). A suppression the address already
-- had from elsewhere (another campaign, an operator, a complaint) is kept, and so is its job.
WITH c AS (
    SELECT id, broadcast_id, bounce_window_from FROM campaigns
     WHERE id = %(campaign_id)s AND status IN ('sending', 'paused', 'finished')
     FOR UPDATE
), bounced AS (
    SELECT DISTINCT a.job_id
      FROM delivery_attempts a, c
     WHERE a.broadcast_id = c.broadcast_id AND a.outcome = 'bounce'
       AND (NOT %(since_pause)s OR a.id >= c.bounce_window_from)
), jobs AS (
    SELECT j.id, j.email
      FROM broadcast_jobs j JOIN bounced b ON b.job_id = j.id
      JOIN subscribers s ON s.id = j.subscriber_id AND s.status = 'active', c
     WHERE j.broadcast_id = c.broadcast_id AND j.status = 'failed' AND j.failure_reason = 'bounced'
       AND NOT EXISTS (SELECT 1 FROM suppressions x WHERE lower(x.email) = lower(j.email)
                        AND (x.reason <> 'bounced' OR x.source_broadcast_id IS DISTINCT FROM c.broadcast_id))
), unsuppressed AS (
    DELETE FROM suppressions x USING jobs j, c
     WHERE lower(x.email) = lower(j.email) AND x.reason = 'bounced' AND x.source_broadcast_id = c.broadcast_id
    RETURNING x.email
), dropped AS (
    DELETE FROM pending_bounces p USING jobs j WHERE p.job_id = j.id
), requeued AS (
    UPDATE broadcast_jobs j SET status = 'retry', failure_reason = NULL, next_attempt_at = now()
      FROM jobs WHERE j.id = jobs.id
    RETURNING j.id
), reopened AS (
    UPDATE campaigns SET status = 'sending', finished_at = NULL, updated_at = now()
     WHERE id = %(campaign_id)s AND status = 'finished' AND EXISTS (SELECT FROM requeued)
)
SELECT c.id, c.broadcast_id, c.bounce_window_from,
       (SELECT count(*) FROM unsuppressed) AS unsuppressed, (SELECT count(*) FROM requeued) AS requeued
  FROM c;

-- name: campaign_cancel
-- Unsent jobs are failed as cancelled; sent ones are untouched; in-flight sends finish and are
-- recorded (jobs put back meanwhile are failed by campaign_cancel_leftovers).
WITH campaign AS (
    UPDATE campaigns SET status = 'cancelled', paused_reason = NULL, finished_at = now(), updated_at = now()
     WHERE id = %(campaign_id)s AND status IN ('draft', 'scheduled', 'sending', 'paused')
    RETURNING id, broadcast_id
), cancelled AS (
    UPDATE broadcast_jobs j SET status = 'failed', failure_reason = 'cancelled'
      FROM campaign c
     WHERE j.broadcast_id = c.broadcast_id AND j.status IN ('pending', 'retry')
    RETURNING j.id
)
SELECT c.id, (SELECT count(*) FROM cancelled) AS jobs FROM campaign c;

-- name: campaign_requeue
-- After fixing a sending problem: the failed jobs of one reason go back in line as due retries
-- (their attempts stay counted), never for an address suppressed since. A finished campaign
-- sends again until they are done; a paused one stays paused (resume sends them); with nothing
-- to requeue nothing changes. Reasons about the address itself are refused before this runs.
WITH target AS (
    SELECT id, broadcast_id, status FROM campaigns
     WHERE id = %(campaign_id)s AND status IN ('sending', 'paused', 'finished')
     FOR UPDATE
), requeued AS (
    UPDATE broadcast_jobs j
       SET status = 'retry', failure_reason = NULL, next_attempt_at = now()
      FROM target t
     WHERE j.broadcast_id = t.broadcast_id AND j.status = 'failed' AND j.failure_reason = %(reason)s
       AND NOT EXISTS (SELECT 1 FROM suppressions x WHERE lower(x.email) = lower(j.email))
    RETURNING j.id
), reopened AS (
    UPDATE campaigns c SET status = CASE WHEN t.status = 'paused' THEN 'paused' ELSE 'sending' END,
                           finished_at = NULL, updated_at = now()
      FROM target t
     WHERE c.id = t.id AND EXISTS (SELECT FROM requeued)
), reopened_broadcast AS (
    UPDATE broadcasts b SET finished_at = NULL
      FROM target t
     WHERE b.id = t.broadcast_id AND EXISTS (SELECT FROM requeued)
)
SELECT t.id, t.broadcast_id, (SELECT count(*) FROM requeued) AS jobs FROM target t;

-- name: campaign_resume
-- A campaign paused while it waited for its send_at goes back to waiting ('scheduled') while that
-- time is ahead: campaigns_start_scheduled starts it then, as if it had never been paused. Past
-- its time (or never scheduled) it sends now.
-- After a bounce-rate pause a person judged the bounces real: the breaker counts afresh from here.
UPDATE campaigns SET status = CASE WHEN send_at > now() THEN 'scheduled' ELSE 'sending' END,
       paused_reason = NULL,
       started_at = CASE WHEN send_at > now() THEN started_at ELSE coalesce(started_at, now()) END,
       auto_resume = false, probe_at = NULL, updated_at = now(),
       bounce_count_from = CASE WHEN paused_reason = 'bounce_rate'
                                THEN (SELECT coalesce(max(a.id), 0) + 1 FROM delivery_attempts a
                                       WHERE a.broadcast_id = campaigns.broadcast_id)
                                ELSE bounce_count_from END
 WHERE id = %(campaign_id)s AND status = 'paused'
RETURNING id, status, send_at;

-- name: campaign_sample_recipients
-- Recipients a send would reach, for checking that the templates render before enqueueing: the
-- oldest and the newest subscribers (two short index walks, whatever the list's size).
(SELECT s.id AS subscriber_id, s.email, s.name, s.attributes
   FROM subscribers s
  WHERE s.status = 'active'
    AND EXISTS (SELECT 1 FROM list_members m WHERE m.subscriber_id = s.id AND m.list_id = ANY(%(list_ids)s))
  ORDER BY s.id LIMIT %(each)s)
UNION
(SELECT s.id, s.email, s.name, s.attributes
   FROM subscribers s
  WHERE s.status = 'active'
    AND EXISTS (SELECT 1 FROM list_members m WHERE m.subscriber_id = s.id AND m.list_id = ANY(%(list_ids)s))
  ORDER BY s.id DESC LIMIT %(each)s)
ORDER BY subscriber_id;

-- name: campaign_missing_attributes
-- Before enqueueing: the recipients a send would enqueue (as broadcast_enqueue picks them) that lack
-- an attribute the templates read on every render. `?&` keeps only the incomplete ones (usually
-- none) in one pass; then, per missing key, how many lack it and the first 5 addresses.
WITH incomplete AS MATERIALIZED (
    SELECT s.id, s.email, s.attributes
      FROM subscribers s
     WHERE s.status = 'active'
       AND NOT s.attributes ?& %(keys)s::text[]
       AND EXISTS (SELECT 1 FROM list_members m WHERE m.subscriber_id = s.id AND m.list_id = ANY(%(list_ids)s))
       AND NOT EXISTS (SELECT 1 FROM suppressions x WHERE lower(x.email) = lower(s.email))
)
SELECT k.key, n.missing,
       ARRAY(SELECT i.email FROM incomplete i WHERE NOT i.attributes ? k.key ORDER BY i.id LIMIT 5) AS examples
  FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS k(key, ord)
 CROSS JOIN LATERAL (SELECT count(*) AS missing FROM incomplete i WHERE NOT i.attributes ? k.key) n
 WHERE n.missing > 0
 ORDER BY k.ord;

-- name: campaign_empty_values
-- Before enqueueing: of the recipients a send would enqueue (as broadcast_enqueue picks them), how
-- many have an empty value (nothing but spaces) where the templates write one out with nothing to
-- stand in for it: %(keys)s are 'name' and 'attributes.KEY'. An attribute missing altogether is
-- campaign_missing_attributes' to say. Only the rows with an empty one are kept, in one pass.
WITH empty AS MATERIALIZED (
    SELECT s.id, s.email, k.key
      FROM subscribers s
     CROSS JOIN LATERAL unnest(%(keys)s::text[]) AS k(key)
     WHERE s.status = 'active'
       AND CASE WHEN k.key = 'name' THEN btrim(coalesce(s.name, '')) = ''
                ELSE s.attributes ? substr(k.key, 12) AND btrim(coalesce(s.attributes ->> substr(k.key, 12), '')) = ''
           END
       AND EXISTS (SELECT 1 FROM list_members m WHERE m.subscriber_id = s.id AND m.list_id = ANY(%(list_ids)s))
       AND NOT EXISTS (SELECT 1 FROM suppressions x WHERE lower(x.email) = lower(s.email))
)
SELECT k.key, n.empty,
       ARRAY(SELECT e.email FROM empty e WHERE e.key = k.key ORDER BY e.id LIMIT 5) AS examples
  FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS k(key, ord)
 CROSS JOIN LATERAL (SELECT count(*) AS empty FROM empty e WHERE e.key = k.key) n
 WHERE n.empty > 0
 ORDER BY k.ord;

-- name: delivery_log
-- Every attempt of a campaign's broadcast; --in-doubt keeps the recipients who may have got two
-- copies: an attempt recorded as in doubt, and the job sent in the end or in doubt once more (a
-- job in flight at several crashes may have gone out at each, then failed as crashed_repeatedly).
-- %(limit)s NULL: all of them
-- (the CLI); the dashboard shows the first few hundred.
-- reason: why the job failed, on the attempt that failed it (bounced, retries_exhausted...).
SELECT a.finished_at AS at, j.email, a.attempt, a.node, a.outcome, a.in_doubt, a.phase, a.smtp_code AS code,
       a.enhanced_code, a.message, a.provider_message_id, a.claim_lost, a.job_id,
       CASE WHEN a.outcome IN ('fail', 'bounce') AND j.status = 'failed' THEN j.failure_reason END AS reason
  FROM delivery_attempts a
  JOIN broadcast_jobs j ON j.id = a.job_id
 WHERE a.broadcast_id = %(broadcast_id)s
   AND (%(email)s::text IS NULL OR lower(j.email) = lower(%(email)s))
   AND (%(outcome)s::text IS NULL OR a.outcome = %(outcome)s)
   AND (NOT %(in_doubt)s OR (a.in_doubt AND (j.status = 'sent'
                                              OR EXISTS (SELECT FROM delivery_attempts x
                                                          WHERE x.job_id = a.job_id AND x.in_doubt AND x.id <> a.id))))
 ORDER BY a.finished_at, a.id
 LIMIT %(limit)s;

-- name: campaign_activity
-- The dashboard's charts: a campaign's sends begun per minute by how they ended, from %(since)s
-- (its start) to %(until)s (now while it sends; when it finished or paused otherwise), the last
-- hour of it at most and ten minutes at least, and what came back per minute after the send
-- (bounces and complaints by the time they arrived). A minute with nothing is a row of zeros, so
-- the chart's time axis has no gaps.
WITH span AS (SELECT date_trunc('minute', %(until)s::timestamptz) AS last),
minutes AS (
    SELECT generate_series(least(last - interval '9 minutes',
                                 greatest(date_trunc('minute', %(since)s::timestamptz), last - interval '59 minutes')),
                           last, interval '1 minute') AS minute
      FROM span),
attempts AS (
    SELECT date_trunc('minute', a.started_at) AS minute,
           count(*) FILTER (WHERE a.outcome = 'sent') AS sent,
           count(*) FILTER (WHERE a.outcome = 'bounce') AS bounced,
           count(*) FILTER (WHERE a.outcome = 'fail') AS failed,
           count(*) FILTER (WHERE a.outcome NOT IN ('sent', 'bounce', 'fail')) AS other
      FROM delivery_attempts a, span
     WHERE a.broadcast_id = %(broadcast_id)s
       AND a.started_at >= span.last - interval '59 minutes'
       AND a.started_at < span.last + interval '1 minute'
     GROUP BY 1),
came_back AS (
    SELECT date_trunc('minute', e.received_at) AS minute,
           count(*) FILTER (WHERE e.kind = 'bounce') AS later_bounces,
           count(*) FILTER (WHERE e.kind = 'complaint') AS complaints
      FROM delivery_events e, span
     WHERE e.broadcast_id = %(broadcast_id)s
       AND e.received_at >= span.last - interval '59 minutes'
       AND e.received_at < span.last + interval '1 minute'
     GROUP BY 1)
SELECT m.minute, coalesce(a.sent, 0) AS sent, coalesce(a.bounced, 0) AS bounced, coalesce(a.failed, 0) AS failed,
       coalesce(a.other, 0) AS other, coalesce(c.later_bounces, 0) AS later_bounces,
       coalesce(c.complaints, 0) AS complaints
  FROM minutes m
  LEFT JOIN attempts a ON a.minute = m.minute
  LEFT JOIN came_back c ON c.minute = m.minute
 ORDER BY m.minute;

-- name: campaign_recent_done
-- Jobs of a campaign done (sent, or failed for good) by sends begun in the last minute, and the
-- seconds of that minute it was sending (less just after it started): its rate, for the ETA.
SELECT (SELECT count(*) FROM delivery_attempts a
         WHERE a.broadcast_id = c.broadcast_id AND a.started_at >= now() - interval '1 minute'
           AND a.outcome IN ('sent', 'bounce', 'fail')) AS done,
       least(60.0, extract(epoch FROM now() - coalesce(c.started_at, now())))::float8 AS seconds
  FROM campaigns c
 WHERE c.id = %(campaign_id)s;

-- name: session_actor
-- Who changes a campaign from the dashboard, for this transaction only: the campaign_events
-- trigger records application_name as the actor (`senddock-dashboard admin`).
SELECT set_config('application_name', %(actor)s, true);
