-- Every query senddock runs, by name. Parameters are always bound (%(name)s).

-- name: list_create
INSERT INTO lists (name) VALUES (%(name)s)
ON CONFLICT ((lower(name))) DO NOTHING
RETURNING id;

-- name: list_by_name
SELECT id, name, created_at FROM lists WHERE lower(name) = lower(%(name)s);

-- name: list_all
SELECT l.id, l.name, l.created_at,
       count(s.id) FILTER (WHERE s.status = 'active') AS active,
       count(s.id) AS members
FROM lists l
LEFT JOIN list_members m ON m.list_id = l.id
LEFT JOIN subscribers s ON s.id = m.subscriber_id
GROUP BY l.id
ORDER BY l.name;

-- name: subscriber_upsert
INSERT INTO subscribers (email, name, attributes)
VALUES (%(email)s, coalesce(%(name)s, ''), %(attributes)s)
ON CONFLICT ((lower(email))) DO UPDATE
   SET name = coalesce(%(name)s, subscribers.name),
       attributes = subscribers.attributes || EXCLUDED.attributes,
       updated_at = now()
RETURNING id, (xmax = 0) AS inserted;

-- name: list_member_add
INSERT INTO list_members (list_id, subscriber_id) VALUES (%(list_id)s, %(subscriber_id)s)
ON CONFLICT DO NOTHING;

-- name: import_staging_create
CREATE TEMPORARY TABLE import_rows (
    line        integer NOT NULL,
    email       text NOT NULL,
    name        text,
    attributes  jsonb NOT NULL
) ON COMMIT DROP;

-- name: import_staging_copy
COPY import_rows (line, email, name, attributes) FROM STDIN;

-- name: import_remove_duplicates
-- A later row with an address already seen in the file is rejected; the first one wins.
DELETE FROM import_rows r
USING (
    SELECT line, first_value(line) OVER (PARTITION BY lower(email) ORDER BY line) AS first_line
    FROM import_rows
) d
WHERE r.line = d.line AND d.line <> d.first_line
RETURNING r.line, r.email, d.first_line;

-- name: import_apply
-- Re-importing updates: the name only when the file has a name column, attributes merged.
-- A subscriber's status is never changed by an import (an unsubscribed address stays so).
WITH upserted AS (
    INSERT INTO subscribers (email, name, attributes)
    SELECT email, coalesce(name, ''), attributes FROM import_rows ORDER BY line
    ON CONFLICT ((lower(email))) DO UPDATE
       SET name = CASE WHEN %(has_name)s THEN EXCLUDED.name ELSE subscribers.name END,
           attributes = subscribers.attributes || EXCLUDED.attributes,
           updated_at = now()
    RETURNING id, (xmax = 0) AS inserted
), joined AS (
    INSERT INTO list_members (list_id, subscriber_id)
    SELECT %(list_id)s, id FROM upserted
    ON CONFLICT DO NOTHING
)
SELECT count(*) FILTER (WHERE inserted) AS imported,
       count(*) FILTER (WHERE NOT inserted) AS updated
FROM upserted;

-- name: campaign_create
INSERT INTO campaigns (name, subject, from_addr, reply_to, text_body, html_body)
VALUES (%(name)s, %(subject)s, %(from_addr)s, %(reply_to)s, %(text_body)s, %(html_body)s)
RETURNING id;

-- name: campaign_add_list
INSERT INTO campaign_lists (campaign_id, list_id) VALUES (%(campaign_id)s, %(list_id)s)
ON CONFLICT DO NOTHING;

-- name: campaign_get
SELECT c.id, c.name, c.subject, c.from_addr, c.reply_to, c.text_body, c.html_body, c.status,
       c.paused_reason, c.broadcast_id, c.send_at, c.created_at, c.started_at, c.finished_at,
       coalesce(array_agg(l.name ORDER BY l.name) FILTER (WHERE l.id IS NOT NULL), '{}') AS lists
FROM campaigns c
LEFT JOIN campaign_lists cl ON cl.campaign_id = c.id
LEFT JOIN lists l ON l.id = cl.list_id
WHERE c.id = %(campaign_id)s
GROUP BY c.id;

-- name: campaign_all
SELECT c.id, c.name, c.subject, c.status, c.broadcast_id, c.send_at, c.created_at, c.started_at,
       c.finished_at, b.enqueued,
       coalesce(array_agg(l.name ORDER BY l.name) FILTER (WHERE l.id IS NOT NULL), '{}') AS lists
FROM campaigns c
LEFT JOIN broadcasts b ON b.id = c.broadcast_id
LEFT JOIN campaign_lists cl ON cl.campaign_id = c.id
LEFT JOIN lists l ON l.id = cl.list_id
GROUP BY c.id, b.id
ORDER BY c.id;

-- name: campaign_lock
SELECT id, status, broadcast_id FROM campaigns WHERE id = %(campaign_id)s FOR UPDATE;

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
SELECT (SELECT count(*) FROM enqueued) AS enqueued,
       count(*) FILTER (WHERE suppressed) AS skipped_suppressed,
       count(*) FILTER (WHERE status <> 'active' AND NOT suppressed) AS skipped_unsubscribed
FROM members;

-- name: broadcast_record_counts
UPDATE broadcasts
   SET enqueued = %(enqueued)s,
       skipped_suppressed = %(skipped_suppressed)s,
       skipped_unsubscribed = %(skipped_unsubscribed)s,
       finished_at = CASE WHEN %(enqueued)s = 0 THEN now() END
 WHERE id = %(broadcast_id)s;

-- name: campaign_start
-- A broadcast with nobody to send to is finished at once.
UPDATE campaigns
   SET status = CASE WHEN %(enqueued)s = 0 THEN 'finished' ELSE 'sending' END,
       broadcast_id = %(broadcast_id)s,
       started_at = now(),
       finished_at = CASE WHEN %(enqueued)s = 0 THEN now() END,
       updated_at = now()
 WHERE id = %(campaign_id)s;

-- name: notify_jobs
SELECT pg_notify('senddock_jobs', %(broadcast_id)s::text);

-- name: broadcast_counts
SELECT b.enqueued AS total,
       b.skipped_suppressed + b.skipped_unsubscribed AS skipped,
       count(j.id) FILTER (WHERE j.status = 'pending') AS pending,
       count(j.id) FILTER (WHERE j.status = 'sending') AS sending,
       count(j.id) FILTER (WHERE j.status = 'retry') AS retry,
       count(j.id) FILTER (WHERE j.status = 'sent') AS sent,
       count(j.id) FILTER (WHERE j.status = 'failed') AS failed,
       count(j.id) FILTER (WHERE j.status = 'failed' AND j.failure_reason = 'bounced') AS bounced
FROM broadcasts b
LEFT JOIN broadcast_jobs j ON j.broadcast_id = b.id
WHERE b.id = %(broadcast_id)s
GROUP BY b.id;

-- name: broadcast_failed_by_reason
SELECT coalesce(failure_reason, 'unknown') AS reason, count(*) AS jobs
FROM broadcast_jobs
WHERE broadcast_id = %(broadcast_id)s AND status = 'failed'
GROUP BY 1
ORDER BY 2 DESC, 1;

-- name: suppression_add
INSERT INTO suppressions (email, reason, code, diagnostic, source_broadcast_id)
VALUES (%(email)s, %(reason)s, %(code)s, %(diagnostic)s, %(broadcast_id)s)
ON CONFLICT ((lower(email))) DO NOTHING
RETURNING id;
