-- Lists and subscribers: creating, importing, unsubscribing, listing. Parameters are always bound (%(name)s).

-- name: list_create
INSERT INTO lists (name) VALUES (%(name)s)
ON CONFLICT ((lower(name))) DO NOTHING
RETURNING id;

-- name: list_by_name
SELECT id, name, created_at FROM lists WHERE lower(name) = lower(%(name)s);

-- name: list_all
-- Members by status from the tallies (migration 18), not by counting each list's members.
SELECT l.id, l.name, l.created_at, coalesce(c.active, 0)::bigint AS active, coalesce(c.members, 0)::bigint AS members
FROM lists l
LEFT JOIN (SELECT t.key[1] AS list_id, sum(t.n) FILTER (WHERE t.key[2] = 'active') AS active, sum(t.n) AS members
             FROM tallies t WHERE t.subject = 'members' GROUP BY 1) c ON c.list_id = l.id::text
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
-- outcome: set by import_apply for each row that inserted or changed a subscriber.
CREATE TEMPORARY TABLE import_rows (
    line        integer NOT NULL,
    email       text NOT NULL,
    name        text,
    attributes  jsonb NOT NULL,
    outcome     text NOT NULL DEFAULT 'unchanged'
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
-- A subscriber whose name and attributes would stay as they are is not written at all (no new
-- row version, updated_at kept), so the upsert returns only the rows it inserted or changed.
WITH upserted AS (
    INSERT INTO subscribers (email, name, attributes)
    SELECT email, coalesce(name, ''), attributes FROM import_rows ORDER BY line
    ON CONFLICT ((lower(email))) DO UPDATE
       SET name = CASE WHEN %(has_name)s THEN EXCLUDED.name ELSE subscribers.name END,
           attributes = subscribers.attributes || EXCLUDED.attributes,
           updated_at = now()
     WHERE (subscribers.name, subscribers.attributes)
           IS DISTINCT FROM (CASE WHEN %(has_name)s THEN EXCLUDED.name ELSE subscribers.name END,
                             subscribers.attributes || EXCLUDED.attributes)
    RETURNING lower(email) AS key, (xmax = 0) AS inserted
)
UPDATE import_rows r
   SET outcome = CASE WHEN u.inserted THEN 'imported' ELSE 'updated' END
  FROM upserted u
 WHERE lower(r.email) = u.key;

-- name: import_join_list
-- A separate statement, so that it sees the subscribers import_apply inserted and every existing
-- one it left untouched. Joining the list is a change too: such a row counts as updated.
WITH joined AS (
    INSERT INTO list_members (list_id, subscriber_id)
    SELECT %(list_id)s, s.id
      FROM import_rows r JOIN subscribers s ON lower(s.email) = lower(r.email)
    ON CONFLICT DO NOTHING
    RETURNING subscriber_id
)
SELECT count(*) FILTER (WHERE r.outcome = 'imported') AS imported,
       count(*) FILTER (WHERE r.outcome = 'updated' OR (r.outcome = 'unchanged' AND j.subscriber_id IS NOT NULL))
           AS updated,
       count(*) FILTER (WHERE r.outcome = 'unchanged' AND j.subscriber_id IS NULL) AS unchanged
  FROM import_rows r
  JOIN subscribers s ON lower(s.email) = lower(r.email)
  LEFT JOIN joined j ON j.subscriber_id = s.id;

-- name: subscriber_by_email
SELECT id AS subscriber_id, email, name, attributes FROM subscribers WHERE lower(email) = lower(%(email)s);

-- name: subscriber_unsubscribe
-- One transaction: the subscriber is 'unsubscribed' and the address suppressed, so neither a
-- later campaign's enqueue nor a running broadcast's claim reaches it. Idempotent: a second
-- click (mail providers repeat them) changes nothing and still answers "unsubscribed".
-- newly: this click unsubscribed them (the earlier status is read under the row's lock, so of
-- two clicks at once one is first).
WITH was AS (
    SELECT id, status FROM subscribers WHERE id = %(subscriber_id)s FOR UPDATE
), target AS (
    UPDATE subscribers s SET status = 'unsubscribed', updated_at = now()
      FROM was w
     WHERE s.id = w.id AND w.status <> 'blocklisted'
    RETURNING s.id, s.email, w.status AS was
), suppressed AS (
    INSERT INTO suppressions (email, reason, diagnostic)
    SELECT email, 'unsubscribed', 'campaign ' || %(campaign_id)s::text FROM target
    ON CONFLICT ((lower(email))) DO UPDATE
       SET reason = EXCLUDED.reason, diagnostic = EXCLUDED.diagnostic, code = NULL, source_broadcast_id = NULL
     WHERE suppressions.reason = 'bounced'
    RETURNING id
)
SELECT s.email, EXISTS (SELECT FROM target) AS found,
       EXISTS (SELECT FROM target WHERE was <> 'unsubscribed') AS newly
  FROM subscribers s WHERE s.id = %(subscriber_id)s;

-- name: subscriber_set_status
-- unsubscribe or blocklist by address; the address is suppressed in the same statement. Never
-- turns a blocklisted subscriber into a merely unsubscribed one. Returns the status it has now.
WITH found AS (
    SELECT id, email, status FROM subscribers WHERE lower(email) = lower(%(email)s) FOR UPDATE
), target AS (
    UPDATE subscribers s SET status = %(status)s, updated_at = now()
      FROM found f
     WHERE s.id = f.id AND NOT (f.status = 'blocklisted' AND %(status)s = 'unsubscribed')
    RETURNING s.id, s.email
), suppressed AS (
    INSERT INTO suppressions (email, reason, diagnostic)
    SELECT email, %(reason)s, %(diagnostic)s FROM found
    ON CONFLICT ((lower(email))) DO UPDATE
       SET reason = EXCLUDED.reason, diagnostic = EXCLUDED.diagnostic, code = NULL, source_broadcast_id = NULL
     WHERE suppressions.reason = 'bounced'
)
SELECT f.id, f.email, coalesce((SELECT %(status)s::text FROM target), f.status) AS status, f.status AS was
  FROM found f;

-- name: subscriber_list
SELECT s.id, s.email, s.name, s.status, s.attributes, s.created_at
  FROM subscribers s
 WHERE %(list_id)s::bigint IS NULL
    OR EXISTS (SELECT 1 FROM list_members m WHERE m.subscriber_id = s.id AND m.list_id = %(list_id)s)
 ORDER BY s.id;

-- name: subscriber_show
SELECT s.id, s.email, s.name, s.status, s.attributes, s.created_at,
       coalesce((SELECT array_agg(l.name ORDER BY l.name) FROM list_members m JOIN lists l ON l.id = m.list_id
                  WHERE m.subscriber_id = s.id), '{}') AS lists,
       x.reason AS suppressed_reason, x.code AS suppressed_code, x.diagnostic AS suppressed_diagnostic,
       x.created_at AS suppressed_at, x.source_broadcast_id AS suppressed_by_broadcast
  FROM subscribers s
  LEFT JOIN suppressions x ON lower(x.email) = lower(s.email)
 WHERE lower(s.email) = lower(%(email)s);
