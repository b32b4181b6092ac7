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
       c.send_rate, coalesce(array_agg(l.name ORDER BY l.name) FILTER (WHERE l.id IS NOT NULL), '{}') AS lists
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

-- name: campaigns_start_scheduled
-- From the poll of every node: scheduled campaigns whose time has come start sending.
UPDATE campaigns SET status = 'sending', started_at = now(), updated_at = now()
 WHERE status = 'scheduled' AND send_at <= now()
RETURNING id, broadcast_id;

-- name: notify_jobs
SELECT pg_notify('senddock_jobs', %(broadcast_id)s::text);

-- name: broadcast_counts
-- One statement, so one short snapshot per refresh of `campaign status --watch` (and the failures
-- by reason add up to the failed count without a REPEATABLE READ transaction around two queries).
-- json, not jsonb: it keeps the reasons in this order, most frequent first.
SELECT b.enqueued AS total,
       b.skipped_suppressed + b.skipped_unsubscribed AS skipped,
       count(j.id) FILTER (WHERE j.status = 'pending') AS pending,
       count(j.id) FILTER (WHERE j.status = 'sending') AS sending,
       count(j.id) FILTER (WHERE j.status = 'retry') AS retry,
       count(j.id) FILTER (WHERE j.status = 'sent') AS sent,
       count(j.id) FILTER (WHERE j.status = 'failed') AS failed,
       count(j.id) FILTER (WHERE j.status = 'failed' AND j.failure_reason = 'bounced') AS bounced,
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
       (SELECT coalesce(json_object_agg(r.reason, r.jobs ORDER BY r.jobs DESC, r.reason), '{}')
          FROM (SELECT coalesce(x.failure_reason, 'unknown') AS reason, count(*) AS jobs
                  FROM broadcast_jobs x
                 WHERE x.broadcast_id = b.id AND x.status = 'failed'
                 GROUP BY 1) r) AS failed_by_reason
FROM broadcasts b
LEFT JOIN broadcast_jobs j ON j.broadcast_id = b.id
WHERE b.id = %(broadcast_id)s
GROUP BY b.id;

-- name: suppression_add
-- A suppression keeps its strongest reason: a complaint, an unsubscribe or an operator's word
-- replaces a bounce (which `campaign unsuppress` may undo), never the other way round.
INSERT INTO suppressions (email, reason, code, diagnostic, source_broadcast_id)
VALUES (%(email)s, %(reason)s, %(code)s, %(diagnostic)s, %(broadcast_id)s)
ON CONFLICT ((lower(email))) DO UPDATE
   SET reason = EXCLUDED.reason, code = EXCLUDED.code, diagnostic = EXCLUDED.diagnostic,
       source_broadcast_id = EXCLUDED.source_broadcast_id
 WHERE suppressions.reason = 'bounced' AND EXCLUDED.reason <> 'bounced'
RETURNING xmax = 0 AS inserted;

-- ---------------------------------------------------------------------------------------------
-- The engine: nodes, claims, results, recovery.

-- name: server_epoch_ensure
-- The server's current epoch, started by whoever first finds the UNLOGGED marker empty (a new
-- database, or one whose server crash-restarted or was promoted: see migration 3). A concurrent
-- starter may win the insert and be invisible to this statement's snapshot: then no row comes
-- back and the caller asks again.
WITH made AS (
    INSERT INTO server_epoch (id) VALUES (gen_random_uuid())
    ON CONFLICT DO NOTHING
    RETURNING id, started_at
)
-- in_flight: whether any job was being sent then (a new database has none: nothing to warn about).
SELECT id, started_at, true AS new, EXISTS (SELECT FROM broadcast_jobs WHERE status = 'sending') AS in_flight
FROM made
UNION ALL
SELECT id, started_at, false, false FROM server_epoch WHERE NOT EXISTS (SELECT FROM made);

-- name: node_register
-- Also on every reconnect of the lifeline: a promoted standby may have lost the node's row (it was
-- registered in the primary's last moments). Then it is made again, with a new lock id, and
-- settled_epoch as given: the epoch it settled in before (it must settle in this one), or, first
-- time, the current one (a new node has nothing to settle). config_digest: see senddock.config_digest.
INSERT INTO nodes (id, name, host, pid, settled_epoch, config_digest)
VALUES (%(node_id)s, %(name)s, %(host)s, %(pid)s, %(settled_epoch)s, %(config_digest)s)
ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name
RETURNING lock_id;

-- name: node_settled
-- This node has re-applied what it remembers (senddock.core.journal) in the current epoch; a claim
-- no longer waits for it. Only if the epoch is still current: another loss of WAL since means
-- settling again.
UPDATE nodes SET settled_epoch = %(epoch)s
 WHERE id = %(node_id)s AND %(epoch)s::uuid = (SELECT id FROM server_epoch)
RETURNING true;

-- name: replication_lag
-- The longest flush lag of the standbys streaming from this server: what an asynchronous standby
-- would not have after a failover now. NULL: no standby, or a role that may not read the lags (its
-- rows show no state then).
SELECT max(extract(epoch FROM coalesce(flush_lag, interval '0')))::float8
  FROM pg_stat_replication WHERE state = 'streaming';

-- name: backend_wait_events
-- What the backends of a node's stuck statements wait for (a commit waiting for a synchronous
-- standby shows IPC/SyncRep): read on a connection of the watchdog's own.
SELECT pid, wait_event_type, wait_event
  FROM pg_stat_activity
 WHERE pid = ANY (%(pids)s::int[]) AND wait_event IS NOT NULL;

-- name: nodes_unsettled
-- Live nodes (a heartbeat within the lease) that have not settled in the current epoch: every
-- claim waits for them.
SELECT n.name, n.host, n.pid, extract(epoch FROM now() - (SELECT started_at FROM server_epoch))::float8 AS epoch_age
  FROM nodes n
 WHERE n.stopped_at IS NULL AND n.settled_epoch IS NOT NULL
   AND n.heartbeat_at > now() - make_interval(secs => %(lease)s::float8)
   AND n.settled_epoch IS DISTINCT FROM (SELECT id FROM server_epoch)
 ORDER BY n.name;

-- name: node_lock
SELECT pg_try_advisory_lock(%(lock_class)s, %(lock_id)s);

-- name: node_name_lock
-- One live process per node name: held on the lifeline for the process's life.
SELECT pg_try_advisory_lock(%(name_class)s, hashtext(%(name)s));

-- name: node_name_holder
-- The incarnation (not this one) holding a node name: its own lifeline lock is granted. Its
-- heartbeat's age tells a live node from a dead host whose session the server keeps (until TCP
-- keepalive notices, possibly hours).
SELECT n.host, n.pid, n.started_at, extract(epoch FROM now() - n.heartbeat_at)::float8 AS heartbeat_age
  FROM nodes n
 WHERE n.name = %(name)s AND n.id IS DISTINCT FROM %(node_id)s
   AND EXISTS (SELECT 1 FROM pg_locks l
                WHERE l.locktype = 'advisory' AND l.granted
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND l.classid = %(lock_class)s::oid AND l.objid = n.lock_id::oid AND l.objsubid = 2)
 ORDER BY n.started_at DESC
 LIMIT 1;

-- name: node_name_end_lingering
-- Sessions still holding a node name whose incarnation is not alive: a dead host's lifeline, or
-- this node's own from before a network cut. Only senddock lifelines are ended, never another
-- application's session (which could hold the same lock key by a hashtext collision).
SELECT count(pg_terminate_backend(l.pid))
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.classid = %(name_class)s::oid AND l.objid = hashtext(%(name)s)::oid AND l.objsubid = 2
   AND a.application_name LIKE 'senddock-lifeline %%';

-- name: node_lock_is_ours
-- Whether the backend answering this statement holds the node's lock (it does not behind a
-- pooler in transaction mode, which runs each transaction on whichever server connection is free).
SELECT EXISTS (SELECT 1 FROM pg_locks l
                WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_backend_pid()
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND l.classid = %(lock_class)s::oid AND l.objid = %(lock_id)s::oid AND l.objsubid = 2);

-- name: node_heartbeat
-- Also says whether the backend answering still holds the node's lock: a heartbeat from a session
-- that does not would prove nothing.
UPDATE nodes SET heartbeat_at = now()
 WHERE id = %(node_id)s
   AND EXISTS (SELECT 1 FROM pg_locks l
                WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_backend_pid()
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND l.classid = %(lock_class)s::oid AND l.objid = %(lock_id)s::oid AND l.objsubid = 2)
RETURNING true;

-- name: node_stopped
UPDATE nodes SET stopped_at = now(), heartbeat_at = now() WHERE id = %(node_id)s;

-- name: jobs_claim
-- Due jobs of running campaigns, taken with SKIP LOCKED: first retries whose delay has passed
-- (so a backoff means what it says even while a big broadcast still has pending jobs), then
-- pending jobs in enqueue order, oldest broadcast first. Each lateral subquery walks one partial
-- index of one running broadcast, so jobs of paused, scheduled or finished campaigns cost
-- nothing, and the outer LIMITs stop after n rows in all: no more than n rows are ever locked.
-- A job whose address was suppressed since the enqueue is failed here instead of being sent.
-- The batch shares one claim token, made by the claimer: it is how this node's orphan recovery
-- tells a claim still held from one abandoned. Pending jobs are walked from the broadcast's claim start (migration 4): no
-- pending job is below it, and the index entries of jobs drained before it are never visited,
-- however old the oldest open snapshot is. The start is read, never locked: claims never wait.
WITH running AS MATERIALIZED (
    SELECT c.id AS campaign_id, c.broadcast_id, c.send_rate, s.from_at, s.from_id
    FROM campaigns c
    JOIN broadcast_claim_starts s ON s.broadcast_id = c.broadcast_id
    WHERE c.status = 'sending' AND c.broadcast_id IS NOT NULL
      -- Nothing while a live node has not settled in the server's current epoch (migration 14):
      -- after a loss of WAL it may be the only one to know a job was sent (senddock.core.journal).
      -- A node that died with the old server is waited for until its lease has passed.
      AND NOT EXISTS (SELECT 1 FROM nodes n
                       WHERE n.stopped_at IS NULL AND n.settled_epoch IS NOT NULL
                         AND n.heartbeat_at > now() - make_interval(secs => %(lease)s::float8)
                         AND n.settled_epoch IS DISTINCT FROM (SELECT id FROM server_epoch))
    ORDER BY c.broadcast_id
), retries AS MATERIALIZED (
    SELECT j.id, r.campaign_id, r.send_rate, j.email
    FROM running r
    CROSS JOIN LATERAL (
        SELECT j.id, j.email
        FROM broadcast_jobs j
        WHERE j.broadcast_id = r.broadcast_id AND j.status = 'retry' AND j.next_attempt_at <= now()
        ORDER BY j.next_attempt_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) j
    LIMIT %(limit)s
), fresh AS MATERIALIZED (
    SELECT j.id, r.campaign_id, r.send_rate, j.email
    FROM running r
    CROSS JOIN LATERAL (
        SELECT j.id, j.email
        FROM broadcast_jobs j
        WHERE j.broadcast_id = r.broadcast_id AND j.status = 'pending'
          -- A row comparison on the index's own columns: the scan starts there, not at the
          -- broadcast's first entry.
          AND (j.next_attempt_at, j.id) >= (r.from_at, r.from_id)
        -- Not "ORDER BY id": the primary key has that order too, and the planner may walk it
        -- through every job of every other broadcast. Only the partial index has this order.
        ORDER BY j.next_attempt_at, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) j
    LIMIT (SELECT %(limit)s - count(*) FROM retries)
), due AS MATERIALIZED (
    -- Materialized: `suppressed` is read by five SET expressions below, and an inlined CTE would
    -- look the address up in suppressions once for each (measured: a claim of 50 with 100,000
    -- suppressions took 4.7 ms, 3.9 ms looking up once).
    SELECT d.id, d.campaign_id, d.send_rate,
           EXISTS (SELECT 1 FROM suppressions x WHERE lower(x.email) = lower(d.email)) AS suppressed
    FROM (SELECT * FROM retries UNION ALL SELECT * FROM fresh) d
), durable AS (
    -- Claims always commit synchronously, whatever the server's default: a claim lost in a crash
    -- could let another node send a job this node is sending.
    SELECT set_config('synchronous_commit', 'on', true)
)
UPDATE broadcast_jobs j
   SET status = CASE WHEN due.suppressed THEN 'failed' ELSE 'sending' END,
       failure_reason = CASE WHEN due.suppressed THEN 'suppressed' ELSE j.failure_reason END,
       claimed_by = CASE WHEN due.suppressed THEN NULL ELSE %(node_id)s::uuid END,
       claimed_at = now(),
       claim_token = CASE WHEN due.suppressed THEN NULL ELSE %(claim_token)s::uuid END,
       -- With results committed synchronously a crash loses none: batch order still tells what
       -- began (NULL). Asynchronously, the epoch; none known yet is treated as already lost.
       claim_epoch = CASE WHEN %(async_results)s THEN coalesce((SELECT id FROM server_epoch), gen_random_uuid()) END,
       -- Marked begun in the claim itself when every claimed job goes straight to a sender; a job
       -- that must pass a limit first (pacing, a campaign's rate) is marked by jobs_begin.
       -- NULL: a caller that sends its batch in id order (the batch's order says what began).
       send_begun = CASE WHEN due.suppressed OR %(begun)s::boolean IS NULL THEN NULL
                         ELSE %(begun)s AND due.send_rate IS NULL END
  FROM due, durable, subscribers s
 WHERE j.id = due.id AND s.id = j.subscriber_id
RETURNING j.id, j.broadcast_id, due.campaign_id, j.subscriber_id, j.email, s.name, s.attributes,
          j.attempts, j.deferrals, j.claim_token,
          coalesce(extract(epoch FROM now() - j.first_attempt_at), 0)::float8 AS age, due.suppressed,
          j.domain, due.send_rate, j.send_begun, j.claim_epoch;

-- name: jobs_record_results
-- The completer's group commit: the results of many sends in one statement and one commit. Each
-- job's outcome applies only under its own claim token while it is still 'sending': a result for a job whose claim was taken over (its node was presumed dead)
-- changes nothing, and its attempt row says claim_lost. A delivery under a lost claim still marks
-- the job sent unless someone sent it since, so it never goes out again because its node was
-- slow (in doubt: it may have gone out twice). A pause outcome puts the job back to 'pending' as it
-- was, its key in claim_putbacks (migration 4). A bounce's pending on_bounced hooks commit with it,
-- even under a lost claim: the address is dead whoever owns the job now.
-- Returns, per job, whether its result applied and whether a lost claim's delivery marked it sent.
-- The rows come as one JSON array of objects, one per job: one parameter costs the client the same
-- whatever the group's size, where an array per column cost it 22 array adaptations per commit.
-- LIMIT (the array's length) is the planner's estimate: without it a set-returning function counts
-- as 100 rows, enough for the plan to join broadcast_jobs by a sequential scan.
WITH r AS (
    SELECT *
    FROM json_to_recordset(%(results)s::json)
         AS r (job_id bigint, claim_token uuid, broadcast_id bigint, campaign_id bigint, email text, attempt int,
               status text, counts int, deferred int, delay float8, failure_reason text, last_result text,
               provider_message_id text, started_at timestamptz, outcome text, in_doubt boolean, ok boolean,
               phase text, code int, enhanced_code text, bounce boolean, pause_reason text)
    LIMIT %(count)s
), result AS (
    UPDATE broadcast_jobs j
       SET status = r.status,
           attempts = j.attempts + r.counts,
           deferrals = j.deferrals + r.deferred,
           next_attempt_at = CASE WHEN r.delay IS NULL THEN j.next_attempt_at
                                  ELSE now() + make_interval(secs => r.delay) END,
           failure_reason = r.failure_reason,
           last_result = r.last_result,
           sent_at = CASE WHEN r.status = 'sent' THEN now() END,
           provider_message_id = coalesce(r.provider_message_id, j.provider_message_id),
           first_attempt_at = coalesce(j.first_attempt_at, j.claimed_at),
           claimed_by = NULL, claim_token = NULL, send_begun = NULL
      FROM r
     WHERE j.id = r.job_id AND j.claim_token = r.claim_token AND j.status = 'sending'
    RETURNING j.id, j.broadcast_id, j.next_attempt_at, j.status
), late AS (
    -- Rows disjoint from result's: one statement must not update a row twice. held: the job is
    -- under another claim (its token is left as it was): that send may be a second one. A job
    -- nobody held (pending, retry: its claim lost with a failover's WAL, or recovered as in doubt
    -- elsewhere) was sent once.
    UPDATE broadcast_jobs j
       SET status = 'sent', sent_at = now(), attempts = j.attempts + 1, failure_reason = NULL,
           last_result = r.last_result,
           provider_message_id = coalesce(r.provider_message_id, j.provider_message_id)
      FROM r
     WHERE j.id = r.job_id AND r.ok AND j.status <> 'sent'
       AND NOT EXISTS (SELECT FROM result x WHERE x.id = r.job_id)
    RETURNING j.id, j.claim_token IS NOT NULL AS held
), put_back AS (
    INSERT INTO claim_putbacks (broadcast_id, next_attempt_at, job_id)
    SELECT DISTINCT ON (broadcast_id) broadcast_id, next_attempt_at, id
      FROM result WHERE status = 'pending'
     ORDER BY broadcast_id, next_attempt_at, id
), attempt AS (
    INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, node, node_id, started_at, outcome,
                                   in_doubt, phase, smtp_code, enhanced_code, message,
                                   provider_message_id, claim_lost)
    SELECT r.job_id, r.broadcast_id, r.attempt, %(node)s, %(node_id)s, r.started_at, r.outcome,
           -- A message delivered under a lost claim may have gone out twice (in doubt): when the
           -- job was sent already, or is being sent under another claim.
           r.in_doubt OR (r.ok AND x.id IS NULL AND (l.id IS NULL OR l.held)), r.phase, r.code,
           r.enhanced_code, r.last_result, r.provider_message_id, x.id IS NULL
      FROM r LEFT JOIN result x ON x.id = r.job_id LEFT JOIN late l ON l.id = r.job_id
), bounce AS (
    INSERT INTO pending_bounces (job_id, broadcast_id, campaign_id, email, code, enhanced_code, diagnostic, node_id)
    SELECT r.job_id, r.broadcast_id, r.campaign_id, r.email, r.code, r.enhanced_code, r.last_result, %(node_id)s
      FROM r WHERE r.bounce
    ON CONFLICT (job_id) DO NOTHING
), paused AS (
    -- A pause outcome (the relay refused our credentials, a template failed...) pauses its
    -- campaign in this same commit, so no claim after it takes another of the campaign's jobs.
    -- Like campaign_pause for a pause that waits for a person.
    UPDATE campaigns c
       SET status = 'paused', paused_reason = p.reason, paused_at = now(), updated_at = now(),
           auto_resume = false, probe_at = NULL, probes = 0, probe_result = NULL
      FROM (SELECT DISTINCT ON (r.campaign_id) r.campaign_id, r.pause_reason AS reason
              FROM r JOIN result x ON x.id = r.job_id
             WHERE r.pause_reason IS NOT NULL
             ORDER BY r.campaign_id, r.job_id) p
     WHERE c.id = p.campaign_id
       AND (c.status IN ('sending', 'scheduled') OR (c.status = 'paused' AND c.auto_resume))
    RETURNING c.id
), marked AS (
    -- Jobs this node claimed ahead (its deck), marked begun in the commit that frees the slots
    -- they take: their sends begin once it returns (it is synchronous then). Fenced by their own
    -- claim tokens, and only while their campaign still sends and got no pause outcome here (the
    -- pause above is not visible to this statement's snapshot). Rows disjoint from result's and
    -- late's: those are the results' jobs. Each job's token is looked up by its position in the
    -- ids, and the campaigns paused here are one hashed set: the planner counts few 'sending'
    -- jobs, and a join with unnest(ids, tokens) and a NOT EXISTS on r became nested loops over
    -- every 'sending' job of the broadcast times every id (a commit of 200 marks with 1,200 jobs
    -- in flight: 53 ms, against 10 ms this way; the same at 40 and 5).
    UPDATE broadcast_jobs j
       SET send_begun = true
      FROM campaigns c
     WHERE j.id = ANY (%(begin_ids)s::bigint[]) AND j.status = 'sending'
       AND j.claim_token = (%(begin_tokens)s::uuid[])[array_position(%(begin_ids)s::bigint[], j.id)]
       AND c.broadcast_id = j.broadcast_id AND c.status = 'sending'
       AND c.id NOT IN (SELECT r.campaign_id FROM r WHERE r.pause_reason IS NOT NULL AND r.campaign_id IS NOT NULL)
    RETURNING j.id
)
-- synchronous_commit for this commit only: 'off' with database.result_commit: async (claims and
-- begin marks stay synchronous; see docs/engine.md).
-- paused_now: this statement paused the job's campaign (on the campaign's first job in it).
-- begun: the jobs of begin_ids marked begun (the same on every row).
-- stopped: the results' campaigns that no longer send (paused or cancelled by anyone, as of this
-- statement's snapshot): the node's next jobs of theirs, marked begun already, stay unsent.
-- The columns, read by position (the statement stays under psycopg's 4 KB parse cache): job_id,
-- recorded, late_sent, paused_now, begun, stopped, and the setting.
SELECT r.job_id, x.id IS NOT NULL, l.id IS NOT NULL,
       r.pause_reason IS NOT NULL AND r.job_id = min(r.job_id) FILTER (WHERE r.pause_reason IS NOT NULL)
                                                  OVER (PARTITION BY r.campaign_id)
       AND r.campaign_id IN (SELECT id FROM paused),
       (SELECT array_agg(id) FROM marked),
       (SELECT array_agg(c.id) FROM campaigns c
         WHERE c.id IN (SELECT campaign_id FROM r) AND c.status <> 'sending'),
       set_config('synchronous_commit', %(synchronous_commit)s, true)
  FROM r LEFT JOIN result x ON x.id = r.job_id LEFT JOIN late l ON l.id = r.job_id;

-- name: jobs_results_recorded
-- After a lost connection or a server epoch change: which of these results did this node commit
-- (the reply was lost, or a Postgres crash may have lost the commit since)? Each send's attempt
-- row carries this node and the send's start time, so it identifies that one commit. Returns the
-- job ids found, with their claim_lost.
SELECT a.job_id, a.claim_lost
  FROM unnest(%(job_ids)s::bigint[], %(started_ats)s::timestamptz[]) AS r (job_id, started_at)
  JOIN delivery_attempts a ON a.job_id = r.job_id AND a.node_id = %(node_id)s
                          AND a.started_at IS NOT DISTINCT FROM r.started_at;

-- name: jobs_begin
-- After the limits were taken for jobs claimed with send_begun = false: the admitted ones are
-- marked begun (this commit is synchronous: a send begins only after it), the held-back ones go
-- back to wait for their limit, as 'retry' due when it has room, with no attempt spent and nothing
-- in doubt (their send never began). Both fenced by the claim token. A job whose campaign stopped
-- sending since its claim (paused, cancelled: a job may wait on the deck) is neither: the caller
-- puts it back.
WITH begun AS (
    UPDATE broadcast_jobs j
       SET send_begun = true
      FROM campaigns c
     WHERE j.id = ANY (%(begun_ids)s::bigint[]) AND j.claim_token = %(claim_token)s AND j.status = 'sending'
       AND c.broadcast_id = j.broadcast_id AND c.status = 'sending'
    RETURNING j.id
), held AS (
    UPDATE broadcast_jobs j
       SET status = 'retry', next_attempt_at = h.due_at, send_begun = NULL,
           claimed_by = NULL, claim_token = NULL, claimed_at = NULL
      FROM unnest(%(held_ids)s::bigint[], %(held_due)s::timestamptz[]) AS h (id, due_at)
     WHERE j.id = h.id AND j.claim_token = %(claim_token)s AND j.status = 'sending'
    RETURNING j.id
), durable AS (
    SELECT set_config('synchronous_commit', 'on', true)
)
SELECT (SELECT array_agg(id) FROM begun), (SELECT count(*) FROM held), (SELECT 1 FROM durable);

-- name: jobs_reclaim
-- After a loss of WAL (a failover to an asynchronous standby, a crash): this live node's jobs
-- begun and not recorded yet are taken back under their own claims and marked begun, where the
-- server lost the claim (the job is pending or retry again) or its begin mark. Their results are
-- then recorded as usual, and a death of this node leaves them in doubt, never silently pending.
-- A job that someone else has claimed since, or that has a result, is left alone. Synchronous,
-- like a claim.
WITH taken AS (
    UPDATE broadcast_jobs j
       SET status = 'sending', claimed_by = %(node_id)s, claim_token = r.token,
           claimed_at = coalesce(j.claimed_at, now()), send_begun = true,
           claim_epoch = CASE WHEN %(async_results)s THEN (SELECT id FROM server_epoch) END
      FROM unnest(%(job_ids)s::bigint[], %(tokens)s::uuid[]) AS r (id, token)
     WHERE j.id = r.id
       AND (j.status IN ('pending', 'retry')
            OR (j.status = 'sending' AND j.claim_token = r.token AND j.send_begun IS NOT TRUE))
    RETURNING j.id
), durable AS (
    SELECT set_config('synchronous_commit', 'on', true)
)
SELECT (SELECT array_agg(id) FROM taken), (SELECT 1 FROM durable);

-- name: jobs_in_flight_by_domain
-- Sends in flight in the whole cluster (marked begun, not recorded), by recipient domain: what
-- a domain group's `concurrency` counts. Walks the small 'sending' index only.
SELECT domain, count(*) FROM broadcast_jobs WHERE status = 'sending' AND send_begun GROUP BY domain;

-- name: concurrency_locks
-- One transaction-scoped lock per domain group with a concurrency limit, taken in key order (no
-- two nodes wait for each other in a cycle) and held until the begin marks commit: two nodes never
-- count the same free room.
SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(k)) FROM unnest(%(keys)s::text[]) AS k ORDER BY k;

-- name: jobs_release
-- Claimed jobs that were never started go back as they were (a shutdown, a pause, a lost claim).
-- The lowest key going back to 'pending' in each broadcast is recorded in the same statement, so
-- no claim starts above it (migration 4).
WITH released AS (
    UPDATE broadcast_jobs j
       SET status = CASE WHEN j.attempts = 0 THEN 'pending' ELSE 'retry' END,
           claimed_by = NULL, claim_token = NULL, claimed_at = NULL, send_begun = NULL
      FROM unnest(%(job_ids)s::bigint[], %(claim_tokens)s::uuid[]) AS r(id, token)
     WHERE j.id = r.id AND j.claim_token = r.token AND j.status = 'sending'
    RETURNING j.id, j.broadcast_id, j.next_attempt_at, j.status
), put_back AS (
    INSERT INTO claim_putbacks (broadcast_id, next_attempt_at, job_id)
    SELECT DISTINCT ON (broadcast_id) broadcast_id, next_attempt_at, id
      FROM released WHERE status = 'pending'
     ORDER BY broadcast_id, next_attempt_at, id
)
SELECT id FROM released;

-- name: jobs_recover
-- Jobs left 'sending' that nobody will finish, returned to the queue. Two sources:
--  * incarnations that are gone (with %(dead_nodes)s): our own name's earlier incarnations at
--    once when their lifeline lock is provably not held (and they held it on this server since
--    its last start), anyone else's only once their heartbeat is older than the lease (database
--    clock);
--  * with %(orphans)s, this live node's own jobs whose claim it no longer holds: a claim whose
--    reply never came and the claimer could not put back, a node that gave up on results (its
--    database gone too long), or a Postgres crash that lost results committed asynchronously. The
--    claimer holds a claim's token from before the claim commits, and a claim younger than a
--    second is left alone: the token list was read just before this statement.
-- Re-checked inside this one statement: still 'sending', same claim, owner still gone or the
-- batch still unheld. In doubt: the jobs marked send_begun (their send may have begun). For a
-- batch claimed without marks (send_begun NULL: sent one at a time in id order), the lowest-id job
-- still 'sending', or every job of it when it was claimed in an earlier server epoch (the server
-- lost the end of its WAL since: any of the batch's results may be gone). In-doubt jobs are
-- recorded as such, then retried or failed; the others go back as they were.
WITH epoch AS MATERIALIZED (
    -- A lock proves something only if it could have been taken in this server's current life:
    -- since its last start (locks die with it) and since its last loss of WAL (crash-restarts
    -- and failovers keep pg_postmaster_start_time(), or predate it).
    SELECT (SELECT id FROM server_epoch) AS id,
           greatest(pg_postmaster_start_time(),
                    coalesce((SELECT started_at FROM server_epoch), 'infinity')) AS locks_since
), dead AS (
    SELECT n.id, n.name
    FROM nodes n
    WHERE %(dead_nodes)s AND n.id <> %(node_id)s
      AND (
            n.heartbeat_at < now() - make_interval(secs => %(lease)s::float8)
         OR (n.name = %(name)s
             AND n.heartbeat_at >= (SELECT locks_since FROM epoch)
             AND NOT EXISTS (
                 SELECT 1 FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.granted
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND l.classid = %(lock_class)s::oid AND l.objid = n.lock_id::oid AND l.objsubid = 2))
      )
), locked AS (
    SELECT j.id, j.claim_token, j.claimed_by, j.claimed_at, j.send_begun,
           j.claim_epoch IS NOT NULL AND j.claim_epoch IS DISTINCT FROM (SELECT id FROM epoch) AS wal_lost
    FROM broadcast_jobs j
    WHERE j.status = 'sending'
      AND (j.claimed_by IN (SELECT id FROM dead)
           OR (%(orphans)s AND j.claimed_by = %(node_id)s
               AND j.claim_token <> ALL (%(held_tokens)s::uuid[])
               AND j.claimed_at < now() - interval '1 second'
               -- Not before this node has settled in this epoch: a result it is about to commit
               -- again would find its job recovered (and sent again) first.
               AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = %(node_id)s
                                AND n.settled_epoch IS DISTINCT FROM (SELECT id FROM epoch))))
    FOR UPDATE OF j SKIP LOCKED
), victims AS (
    -- send_begun was committed synchronously before the send began, so a crash-restart keeps it
    -- (a lost result brings its job back 'sending' and begun: in doubt). A promoted asynchronous
    -- standby may not have it (nor the claim): a live node marks its jobs again before anyone
    -- claims (jobs_reclaim); a node that died with the old primary leaves them looking unstarted.
    -- NULL: a batch sent in id order by an earlier version (see the header).
    SELECT l.*, coalesce(l.send_begun,
                         l.id = min(l.id) OVER (PARTITION BY l.claim_token) OR l.wal_lost) AS started
    FROM locked l
), recovered AS (
    UPDATE broadcast_jobs j
       SET status = CASE
               WHEN NOT v.started THEN CASE WHEN j.attempts = 0 THEN 'pending' ELSE 'retry' END
               WHEN j.rescues + 1 > %(max_rescues)s THEN 'failed'
               WHEN %(in_doubt)s = 'fail' THEN 'failed'
               ELSE 'retry' END,
           failure_reason = CASE
               WHEN NOT v.started THEN j.failure_reason
               WHEN j.rescues + 1 > %(max_rescues)s THEN 'crashed_repeatedly'
               WHEN %(in_doubt)s = 'fail' THEN 'in_doubt'
               ELSE j.failure_reason END,
           rescues = j.rescues + v.started::int,
           attempts = j.attempts + v.started::int,
           next_attempt_at = CASE WHEN v.started THEN now() ELSE j.next_attempt_at END,
           first_attempt_at = CASE WHEN v.started THEN coalesce(j.first_attempt_at, v.claimed_at)
                                   ELSE j.first_attempt_at END,
           last_result = CASE WHEN NOT v.started THEN j.last_result
                              WHEN v.wal_lost THEN 'in doubt: its result may have been lost in a Postgres crash or failover'
                              WHEN v.claimed_by = %(node_id)s THEN 'in doubt: its result was never committed'
                              ELSE 'in doubt: its node died while sending' END,
           claimed_by = NULL, claim_token = NULL, claimed_at = NULL, send_begun = NULL
      FROM victims v
     WHERE j.id = v.id AND j.status = 'sending' AND j.claim_token = v.claim_token
       AND (j.claimed_by IN (SELECT id FROM dead) OR j.claimed_by = %(node_id)s)
    RETURNING j.id, j.broadcast_id, j.email, j.status, j.failure_reason, j.attempts, j.last_result,
              j.next_attempt_at, v.started, v.claimed_at, v.claimed_by
), put_back AS (
    -- Unstarted jobs going back to 'pending': recorded in this same statement (migration 4).
    INSERT INTO claim_putbacks (broadcast_id, next_attempt_at, job_id)
    SELECT DISTINCT ON (broadcast_id) broadcast_id, next_attempt_at, id
      FROM recovered WHERE status = 'pending'
     ORDER BY broadcast_id, next_attempt_at, id
), logged AS (
    INSERT INTO delivery_attempts (job_id, broadcast_id, attempt, node, node_id, started_at,
                                   outcome, in_doubt, message)
    SELECT r.id, r.broadcast_id, r.attempts, %(name)s, %(node_id)s, r.claimed_at, 'in_doubt', true,
           r.last_result || coalesce(' (node ' || d.name || ', ' || r.claimed_by || ')', '') || '; '
           || CASE WHEN r.status = 'failed' THEN 'failed as ' || r.failure_reason ELSE 'sent again' END
    FROM recovered r LEFT JOIN dead d ON d.id = r.claimed_by
    WHERE r.started
)
SELECT r.id, r.broadcast_id, r.email, r.status, r.failure_reason, r.started AS in_doubt,
       coalesce(d.name, %(name)s) AS dead_node
FROM recovered r LEFT JOIN dead d ON d.id = r.claimed_by;

-- name: campaign_pause
-- Scheduled campaigns can be paused too: resume makes them wait for send_at again. With auto_resume (a pause
-- for relay trouble) the relay is probed from probe_in seconds on, and the campaign resumes by
-- itself once it answers (campaign_probe_due, campaign_auto_resume).
-- An operator may also pause a campaign paused for relay trouble: it then waits for them.
UPDATE campaigns
   SET status = 'paused', paused_reason = %(reason)s, paused_at = now(), updated_at = now(),
       auto_resume = %(auto_resume)s,
       probe_at = CASE WHEN %(auto_resume)s THEN now() + make_interval(secs => %(probe_in)s::float8) END,
       probes = 0, probe_result = NULL
 WHERE id = %(campaign_id)s
   AND (status IN ('sending', 'scheduled') OR (status = 'paused' AND auto_resume AND NOT %(auto_resume)s))
RETURNING id;

-- name: campaign_probe_due
-- One campaign whose relay is due for a probe, taken by one node (SKIP LOCKED) and moved to its
-- next probe time first (doubling, up to max_interval), so a node that dies mid-probe delays it
-- by one interval at most and two nodes never probe for the same campaign at once.
UPDATE campaigns c
   SET probes = c.probes + 1,
       -- The exponent is capped: 2^1024 overflows float8, which would fail every later probe.
       probe_at = now() + make_interval(secs => least(%(interval)s::float8 * power(2, least(c.probes + 1, 30)),
                                                      %(max_interval)s::float8))
  FROM (SELECT id FROM campaigns
         WHERE status = 'paused' AND auto_resume AND probe_at <= now()
         ORDER BY probe_at LIMIT 1
         FOR UPDATE SKIP LOCKED) due
 WHERE c.id = due.id
RETURNING c.id, c.probes, c.paused_reason;

-- name: campaign_probe_failed
UPDATE campaigns SET probe_result = %(result)s
 WHERE id = %(campaign_id)s AND status = 'paused' AND auto_resume;

-- name: campaign_auto_resume
-- The relay answered: the campaign sends again, unless a person paused or cancelled it meanwhile.
UPDATE campaigns
   SET status = 'sending', paused_reason = NULL, auto_resume = false, probe_at = NULL,
       probe_result = %(result)s, updated_at = now()
 WHERE id = %(campaign_id)s AND status = 'paused' AND auto_resume
RETURNING broadcast_id;

-- name: campaign_bounce_check
-- After a bounce, at the send or later by mail or notification: the bounce-rate breaker. More than `rate` of the broadcast's last `window`
-- results, or more than `early_bounces` of its first `early_window`, bounced: pause the campaign
-- (reason bounce_rate) and remember where that window began, so the suppressions it made can be
-- undone (campaign_unsuppress). Results are final verdicts (sent, bounced, failed: not retries,
-- which throttling would multiply, not pauses, not recovery's in-doubt rows, not lost claims). Both walks are short, on (broadcast_id, id). Returns whether the
-- campaign is paused for its bounce rate now: its bounces' hooks wait until a person decides.
WITH counted AS MATERIALIZED (
    SELECT bounce_count_from FROM campaigns WHERE id = %(campaign_id)s
), recent AS (
    SELECT id, job_id, outcome FROM delivery_attempts
     WHERE broadcast_id = %(broadcast_id)s AND outcome IN ('sent', 'bounce', 'fail') AND NOT claim_lost
       AND id >= (SELECT bounce_count_from FROM counted)
     ORDER BY id DESC LIMIT %(window)s
), early AS (
    SELECT id, job_id, outcome FROM delivery_attempts
     WHERE broadcast_id = %(broadcast_id)s AND outcome IN ('sent', 'bounce', 'fail') AND NOT claim_lost
       AND id >= (SELECT bounce_count_from FROM counted)
     ORDER BY id LIMIT %(early_window)s
), later AS (
    -- A message sent, then bounced hard after the send (a DSN, a provider's notification), is a
    -- bounce of the window it was sent in.
    SELECT DISTINCT e.job_id FROM delivery_events e
     WHERE e.broadcast_id = %(broadcast_id)s AND e.kind = 'bounce' AND e.bounce_type = 'Permanent'
), verdict AS (
    SELECT CASE
             WHEN (SELECT count(*) FROM early
                    WHERE outcome = 'bounce' OR (outcome = 'sent' AND job_id IN (SELECT job_id FROM later)))
                  > %(early_bounces)s
               THEN (SELECT min(id) FROM early)
             WHEN (SELECT count(*) FROM recent
                    WHERE outcome = 'bounce' OR (outcome = 'sent' AND job_id IN (SELECT job_id FROM later)))
                  > %(rate)s::float8 * %(window)s
               THEN (SELECT min(id) FROM recent)
           END AS window_from
), tripped AS (
    UPDATE campaigns c
       SET status = 'paused', paused_reason = 'bounce_rate', paused_at = now(), updated_at = now(),
           auto_resume = false, probe_at = NULL, bounce_window_from = v.window_from
      FROM verdict v
     WHERE c.id = %(campaign_id)s AND c.status = 'sending' AND v.window_from IS NOT NULL
    RETURNING c.id
)
SELECT EXISTS (SELECT FROM tripped) AS tripped,
       EXISTS (SELECT FROM tripped)
       OR EXISTS (SELECT 1 FROM campaigns WHERE id = %(campaign_id)s
                   AND status = 'paused' AND paused_reason = 'bounce_rate') AS holding;

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

-- name: campaign_cancel_leftovers
-- Jobs put back after their campaign was cancelled (from the poll, and after a cancel).
UPDATE broadcast_jobs j SET status = 'failed', failure_reason = 'cancelled'
  FROM campaigns c
 WHERE c.status = 'cancelled' AND j.broadcast_id = c.broadcast_id AND j.status IN ('pending', 'retry')
RETURNING j.id;

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

-- name: campaigns_finish
-- A campaign stays 'sending' until every job of its broadcast is sent or failed. Run after result
-- commits and from the poll: whoever commits the last result sees all others' commits.
UPDATE campaigns c
   SET status = 'finished', finished_at = now(), updated_at = now()
 WHERE c.status = 'sending'
   AND c.broadcast_id IS NOT NULL
   AND (%(broadcast_id)s::bigint IS NULL OR c.broadcast_id = %(broadcast_id)s)
   -- One probe per unfinished state, each answered by its own small partial index. Pending jobs
   -- are looked for from the claim start (none is below it) in index order, as a claim would: not
   -- over the leftover entries of every job drained while a snapshot is open.
   AND NOT EXISTS (SELECT 1 FROM broadcast_claim_starts s
                    CROSS JOIN LATERAL (SELECT 1 FROM broadcast_jobs j
                                         WHERE j.broadcast_id = s.broadcast_id AND j.status = 'pending'
                                           AND (j.next_attempt_at, j.id) >= (s.from_at, s.from_id)
                                         ORDER BY j.next_attempt_at, j.id LIMIT 1) j
                    WHERE s.broadcast_id = c.broadcast_id)
   AND NOT EXISTS (SELECT 1 FROM broadcast_jobs j WHERE j.broadcast_id = c.broadcast_id AND j.status = 'retry')
   AND NOT EXISTS (SELECT 1 FROM broadcast_jobs j WHERE j.broadcast_id = c.broadcast_id AND j.status = 'sending')
RETURNING c.id, c.broadcast_id;

-- name: claim_floors_lock
-- The broadcasts whose floor this poll raises: those being sent, and any with put-backs to consume
-- (a paused, finished or cancelled campaign's: the raise is right for every broadcast, and the
-- put-backs would otherwise stay for good). A raise takes its broadcasts row (a lock only: no new
-- row version), so two nodes' polls never raise one floor at once: a raise computed from an older
-- snapshot could otherwise replace a newer floor and lose the put-backs that one consumed. SKIP
-- LOCKED: a node that finds it taken leaves it to the other. Claims never lock it: they never wait.
SELECT b.id
  FROM broadcasts b JOIN campaigns c ON c.broadcast_id = b.id
 WHERE c.status = 'sending' OR b.id IN (SELECT p.broadcast_id FROM claim_putbacks p)
 ORDER BY b.id
   FOR NO KEY UPDATE OF b SKIP LOCKED;

-- name: claim_floors_raise
-- From every node's poll, after claim_floors_lock in the same READ COMMITTED transaction (so this
-- snapshot is newer than any earlier raise): each floor moves to the lowest pending key this
-- snapshot sees, walking from the old start (floor or put-back), i.e. over what was drained since
-- the last poll. Jobs a claim in flight has locked are still 'pending' here, so a claim that rolls
-- back strands nothing. The put-backs this snapshot sees are covered by that walk and deleted; a
-- put-back that commits after this snapshot is not visible to the DELETE either, so it stays and
-- keeps the start below its job. With no pending job left, the floor is 'infinity' (only
-- put-backs can bring one back, and they are recorded). A floor that moved is a new row, the one
-- it replaces is deleted (see migration 4 for why it is not updated in place).
WITH current AS (
    SELECT b.id AS broadcast_id, f.id AS floor_row, f.from_at, f.from_id
      FROM broadcasts b
      LEFT JOIN LATERAL (SELECT f.id, f.from_at, f.from_id
                           FROM claim_floors f
                          WHERE f.broadcast_id = b.id
                          ORDER BY f.id DESC
                          LIMIT 1) f ON true
     WHERE b.id = ANY(%(broadcast_ids)s)
), start AS (
    SELECT s.broadcast_id, s.from_at, s.from_id
      FROM broadcast_claim_starts s
     WHERE s.broadcast_id = ANY(%(broadcast_ids)s)
), consumed AS (
    DELETE FROM claim_putbacks p WHERE p.broadcast_id = ANY(%(broadcast_ids)s)
), raised AS (
    SELECT st.broadcast_id,
           coalesce(f.next_attempt_at, 'infinity') AS from_at, coalesce(f.id, 0) AS from_id
      FROM start st
      LEFT JOIN LATERAL (
          SELECT j.next_attempt_at, j.id
            FROM broadcast_jobs j
           WHERE j.broadcast_id = st.broadcast_id AND j.status = 'pending'
             AND (j.next_attempt_at, j.id) >= (st.from_at, st.from_id)
           ORDER BY j.next_attempt_at, j.id
           LIMIT 1
      ) f ON true
), moved AS (
    SELECT r.broadcast_id, r.from_at, r.from_id, c.floor_row
      FROM raised r JOIN current c ON c.broadcast_id = r.broadcast_id
     WHERE (c.from_at, c.from_id) IS DISTINCT FROM (r.from_at, r.from_id)
), replaced AS (
    DELETE FROM claim_floors f USING moved m WHERE f.id = m.floor_row
)
INSERT INTO claim_floors (broadcast_id, from_at, from_id)
SELECT broadcast_id, from_at, from_id FROM moved
RETURNING broadcast_id;

-- name: broadcasts_finished_mark
UPDATE broadcasts SET finished_at = now() WHERE id = ANY(%(broadcast_ids)s) AND finished_at IS NULL;

-- name: due_work_exists
-- Pending jobs from the claim start, in index order, as the claim looks for them.
SELECT EXISTS (
    SELECT 1 FROM campaigns c
    WHERE c.status = 'sending'
      AND (EXISTS (SELECT 1 FROM broadcast_claim_starts s
                    CROSS JOIN LATERAL (SELECT 1 FROM broadcast_jobs j
                                         WHERE j.broadcast_id = s.broadcast_id AND j.status = 'pending'
                                           AND (j.next_attempt_at, j.id) >= (s.from_at, s.from_id)
                                         ORDER BY j.next_attempt_at, j.id LIMIT 1) j
                    WHERE s.broadcast_id = c.broadcast_id)
           OR EXISTS (SELECT 1 FROM broadcast_jobs j WHERE j.broadcast_id = c.broadcast_id
                      AND j.status = 'retry' AND j.next_attempt_at <= now()))
);

-- name: bounces_pending
-- Bounces whose hooks did not all return, claimed by this node so each is handled once (SKIP
-- LOCKED; taking them over makes them this live node's): those of dead or stopped nodes, those
-- held while their campaign was paused for its bounce rate (no node), and any (this node's own
-- too) whose hooks failed and that waited ten minutes. Bounces of a campaign paused for its
-- bounce rate wait: a person decides whether they were real (resume) or not (unsuppress).
-- The conditions are correlated subqueries, not joins: when another node takes a row first, the
-- row lock's recheck re-reads the row and re-runs them with its new owner (a joined nodes row
-- would be rechecked as it was, and both nodes would take the bounce).
UPDATE pending_bounces b
   SET node_id = %(node_id)s, created_at = now()
  FROM (SELECT b.job_id
          FROM pending_bounces b
         WHERE ((b.node_id IS DISTINCT FROM %(node_id)s
                 AND NOT EXISTS (SELECT 1 FROM nodes n
                                  WHERE n.id = b.node_id AND n.stopped_at IS NULL
                                    AND n.heartbeat_at >= now() - make_interval(secs => %(lease)s::float8)))
                OR b.created_at < now() - interval '10 minutes')
           AND NOT EXISTS (SELECT 1 FROM campaigns c
                            WHERE c.id = b.campaign_id AND c.status = 'paused' AND c.paused_reason = 'bounce_rate')
         ORDER BY b.job_id
         LIMIT 100
         FOR UPDATE OF b SKIP LOCKED) due
 WHERE b.job_id = due.job_id
RETURNING b.job_id, b.broadcast_id, b.campaign_id, b.email, b.code, b.enhanced_code, b.diagnostic;

-- name: bounce_hold
-- A bounce of a campaign paused for its bounce rate: no node owns it until a person decides.
UPDATE pending_bounces SET node_id = NULL WHERE job_id = %(job_id)s;

-- name: bounce_done
DELETE FROM pending_bounces WHERE job_id = %(job_id)s;

-- name: bounce_retry_later
UPDATE pending_bounces SET created_at = now() WHERE job_id = %(job_id)s;

-- name: campaign_content
SELECT c.id AS campaign_id, c.name, c.subject, c.from_addr, c.reply_to, c.text_body, c.html_body,
       l.id AS list_id, l.name AS list_name
FROM campaigns c
LEFT JOIN LATERAL (
    SELECT l.id, l.name FROM campaign_lists cl JOIN lists l ON l.id = cl.list_id
    WHERE cl.campaign_id = c.id ORDER BY l.id LIMIT 1
) l ON true
WHERE c.id = %(campaign_id)s;

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

-- name: pacing_take
-- The shared limiter (GCRA, migration 7): admit k <= n sends that every one of the given limits
-- allows (k is the least any of them allows) and move each limit's tat on by k * T, for all nodes
-- at once. Each limit comes with its emission interval T and burst tolerance tau, in seconds. A
-- send i = 0, 1, ... is allowed while (due - t) + i*T <= tau, where due = greatest(tat, t).
-- Returns k, the time t of the decision and, when k < n, the time the next send will be allowed.
-- Must run in READ COMMITTED (a row another take changed is then read as it is once locked).
-- Adaptive pacing (migration 8; recovery NULL when it is off): a limit slowed down by throttling
-- spaces its sends T / f apart, f its factor in force (see pacing_throttled), while its tolerance
-- stays tau seconds, so fewer leave at once too.
WITH wanted AS (
    SELECT w.key, w.t_s, w.tau_s
    FROM unnest(%(keys)s::text[], %(intervals)s::float8[], %(tolerances)s::float8[]) AS w (key, t_s, tau_s)
), locked AS (
    -- Locks in key order, whatever order the caller named the limits in: two takes never wait for
    -- each other in a cycle. ORDER BY is applied before the locks are taken.
    SELECT l.key, l.tat, l.factor, l.factor_at, l.ceiling
    FROM pacing_limits l
    WHERE l.key = ANY (%(keys)s::text[])
    ORDER BY l.key
    FOR UPDATE
), clock AS (
    -- The decision's time: after every lock is ours (the take may have waited for them), and not
    -- now(), which is when a surrounding transaction began.
    SELECT clock_timestamp() AS t, count(*) AS locked FROM locked
), state AS (
    -- greatest() skips NULL: a limit without a row yet is due now, with its whole burst.
    SELECT w.key, w.t_s / f.factor AS t_s, w.tau_s, l.key IS NULL AS missing, c.t, greatest(l.tat, c.t) AS due
    FROM wanted w CROSS JOIN clock c LEFT JOIN locked l ON l.key = w.key
    CROSS JOIN LATERAL (
        -- The factor climbs back by ceiling / recovery a second since it was last halved (the
        -- ceiling: the factor it was halved from, migration 15), up to 1.
        SELECT CASE WHEN %(recovery)s::float8 IS NULL OR l.key IS NULL THEN 1
                    ELSE least(1, l.factor + coalesce(l.ceiling, 1)
                                             * coalesce(greatest(0, extract(epoch FROM c.t - l.factor_at)::float8), 0)
                                             / %(recovery)s::float8) END AS factor
    ) f
), allowed AS (
    -- 1 µs of slack: tat is rounded to the microsecond on every take.
    SELECT s.*, least(%(n)s::int,
                      greatest(0, floor((s.tau_s - extract(epoch FROM s.due - s.t)::float8 + 1e-6) / s.t_s) + 1))::int AS allows
    FROM state s
), decision AS (
    SELECT min(a.allows) AS k, min(a.t) AS t FROM allowed a
), created AS (
    -- A limit's first take creates its row. If another take created it after this statement's
    -- snapshot, its row was neither read nor locked above: nothing is admitted this time (the next
    -- take reads it), so no send is admitted past a limit. The rows this take did create keep
    -- their charge then: a limit is at worst briefly stricter, never looser.
    INSERT INTO pacing_limits AS p (key, tat, updated_at)
    SELECT a.key, a.due + make_interval(secs => d.k * a.t_s), d.t
    FROM allowed a CROSS JOIN decision d
    WHERE a.missing
    ORDER BY a.key
    ON CONFLICT (key) DO NOTHING
    RETURNING p.key
), outcome AS (
    SELECT CASE WHEN (SELECT count(*) FROM created) = (SELECT count(*) FROM allowed WHERE missing)
                THEN d.k ELSE 0 END AS k,
           d.t
    FROM decision d
), advanced AS (
    UPDATE pacing_limits p
       SET tat = a.due + make_interval(secs => o.k * a.t_s), updated_at = o.t
      FROM allowed a CROSS JOIN outcome o
     WHERE p.key = a.key AND NOT a.missing AND o.k > 0
    RETURNING p.key
)
-- The next send needs every limit: it is allowed once the last of them has room again.
SELECT o.k AS admitted, o.t AS at,
       CASE WHEN o.k < %(n)s::int
            THEN greatest(o.t, max(a.due + make_interval(secs => o.k * a.t_s - a.tau_s))) END AS next_at
FROM outcome o CROSS JOIN allowed a
GROUP BY o.k, o.t;

-- name: pacing_throttled
-- Adaptive pacing (AIMD, migrations 8 and 15): a throttling reply halves each given limit's factor
-- in force (never below the floor), remembers that factor as the limit's ceiling (the rate the
-- provider pushed back at), and restarts its recovery from now, unless it was halved less than
-- hold seconds ago: the sends in flight report one throttling many times over. The factor climbs
-- back by ceiling / recovery a second (see pacing_take): a limit throttled at a twentieth of its
-- configured rate climbs back a twentieth as fast, reaching its ceiling again only after half the
-- recovery time, not in two seconds. An upsert, so the guard is checked on the row as it is once
-- locked (ON CONFLICT DO UPDATE reads its latest version): two nodes reporting at once halve it
-- once. A limit without a row yet gets one, due now, halved from 1. Keys locked in key order, as
-- in pacing_take, so the two never wait for each other in a cycle. Returns the limits halved,
-- with their new factor.
INSERT INTO pacing_limits AS p (key, tat, factor, factor_at, ceiling)
SELECT k.key, clock_timestamp(), greatest(%(floor)s::float8, 0.5), clock_timestamp(), 1
FROM (SELECT DISTINCT unnest(%(keys)s::text[]) AS key) k
ORDER BY k.key
ON CONFLICT (key) DO UPDATE
   -- Both from the row as it was: the factor in force now (as pacing_take computes it), halved,
   -- and as the new ceiling.
   SET factor = greatest(%(floor)s::float8,
                         least(1, p.factor + coalesce(p.ceiling, 1)
                                  * coalesce(greatest(0, extract(epoch FROM clock_timestamp() - p.factor_at)::float8), 0)
                                  / %(recovery)s::float8) / 2),
       ceiling = least(1, p.factor + coalesce(p.ceiling, 1)
                          * coalesce(greatest(0, extract(epoch FROM clock_timestamp() - p.factor_at)::float8), 0)
                          / %(recovery)s::float8),
       factor_at = clock_timestamp()
 WHERE p.factor_at IS NULL OR p.factor_at <= clock_timestamp() - make_interval(secs => %(hold)s::float8)
RETURNING p.key, p.factor;

-- name: pacing_status
-- What `status` and `campaign status` show per limit, in one statement (`campaign status --watch`
-- runs it every refresh): the limits' factors with the seconds since each was halved, the
-- campaigns' own rates (the one asked for, or those sending), and the sends begun in the last
-- minute by campaign and recipient domain; the caller matches domains to groups as the claimer
-- does. Sends are counted only when a limit is configured (a one-time filter: no scan otherwise).
-- now(), not clock_timestamp(): stable, so the planner can estimate the minute's rows (and use an
-- index on started_at, if there is one); it is the transaction's start, a moment ago.
WITH clock AS (
    SELECT now() AS t
), rates AS (
    SELECT c.id AS campaign_id, c.send_rate
    FROM campaigns c
    WHERE c.send_rate IS NOT NULL
      AND (c.id = %(campaign_id)s::bigint OR (%(campaign_id)s::bigint IS NULL AND c.status = 'sending'))
), recent AS (
    SELECT b.campaign_id, j.domain, count(*) AS sends
    FROM delivery_attempts a
    JOIN broadcast_jobs j ON j.id = a.job_id
    JOIN broadcasts b ON b.id = a.broadcast_id
    WHERE a.started_at >= now() - interval '1 minute'
      AND (%(configured)s::boolean OR EXISTS (SELECT FROM rates))
    GROUP BY b.campaign_id, j.domain
)
SELECT (SELECT coalesce(json_agg(json_build_object('campaign_id', r.campaign_id, 'send_rate', r.send_rate)), '[]')
          FROM rates r) AS campaign_rates,
       (SELECT coalesce(json_agg(json_build_object(
                   'key', l.key, 'factor', l.factor, 'ceiling', l.ceiling,
                   'halved_ago', extract(epoch FROM (SELECT t FROM clock) - l.factor_at)::float8)), '[]')
          FROM pacing_limits l
         WHERE l.key = ANY (%(keys)s::text[])
            OR l.key IN (SELECT 'campaign:' || r.campaign_id FROM rates r)) AS factors,
       (SELECT coalesce(json_agg(json_build_object('campaign_id', s.campaign_id, 'domain', s.domain, 'sends', s.sends)), '[]')
          FROM recent s) AS recent;

-- name: tallies_fold
-- The tallies of backends that ended, folded into shard 0 (migration 11), and keys that add up to
-- nothing dropped: the table stays a few rows per key however many sessions have come and gone.
-- A live backend's rows are left alone (it may be counting into them now).
WITH gone AS (
    DELETE FROM tallies t
     WHERE t.shard <> 0 AND t.shard NOT IN (SELECT pid FROM pg_stat_activity)
    RETURNING t.subject, t.key, t.n
), folded AS (
    INSERT INTO tallies AS t (subject, key, shard, n)
    SELECT g.subject, g.key, 0, sum(g.n) FROM gone g GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + excluded.n
    RETURNING t.subject
)
SELECT (SELECT count(*) FROM gone) AS folded;

-- name: tallies_drop_empty
DELETE FROM tallies WHERE shard = 0 AND n = 0;

-- name: metrics_jobs
-- senddock_jobs{campaign,status} from the tallies: campaigns under way, and those that ended in
-- the last day (so a finished campaign's last figures are scraped, then its series end).
SELECT c.id AS campaign_id, c.name, c.status AS campaign_status, t.key[2] AS status, sum(t.n)::bigint AS jobs
  FROM campaigns c
  JOIN tallies t ON t.subject = 'jobs' AND t.key[1] = c.broadcast_id::text
 WHERE c.status IN ('scheduled', 'sending', 'paused')
    OR (c.status IN ('finished', 'cancelled') AND coalesce(c.finished_at, c.updated_at) > now() - interval '1 day')
 GROUP BY 1, 2, 3, 4;

-- name: metrics_totals
-- Bounces by kind and source, and suppressions by reason, from the tallies. A bounce refused at
-- send time is a failed job with reason 'bounced': source 'send'.
SELECT 'bounces' AS subject, t.key[1] AS kind, t.key[2] AS source, sum(t.n)::bigint AS n
  FROM tallies t WHERE t.subject = 'bounces' GROUP BY 1, 2, 3
UNION ALL
SELECT 'bounces', 'hard', 'send', sum(t.n)::bigint
  FROM tallies t WHERE t.subject = 'jobs' AND t.key[2] = 'failed' AND t.key[3] = 'bounced'
UNION ALL
SELECT 'suppressions', t.key[1], NULL, sum(t.n)::bigint
  FROM tallies t WHERE t.subject = 'suppressions' GROUP BY 1, 2, 3;

-- name: metrics_queue_lag
-- Per sending campaign, the age of its oldest due job: the first entry of each partial index
-- (pending from the claim start, as the claim walks it; retries whose time has come). 0 when
-- nothing is due.
SELECT c.id AS campaign_id,
       coalesce(extract(epoch FROM now() - least(p.at, r.at)), 0)::float8 AS lag
  FROM campaigns c
  JOIN broadcast_claim_starts s ON s.broadcast_id = c.broadcast_id
  LEFT JOIN LATERAL (
      SELECT j.next_attempt_at AS at FROM broadcast_jobs j
       WHERE j.broadcast_id = c.broadcast_id AND j.status = 'pending'
         AND (j.next_attempt_at, j.id) >= (s.from_at, s.from_id) AND j.next_attempt_at <= now()
       ORDER BY j.next_attempt_at, j.id LIMIT 1) p ON true
  LEFT JOIN LATERAL (
      SELECT j.next_attempt_at AS at FROM broadcast_jobs j
       WHERE j.broadcast_id = c.broadcast_id AND j.status = 'retry' AND j.next_attempt_at <= now()
       ORDER BY j.next_attempt_at LIMIT 1) r ON true
 WHERE c.status = 'sending';

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

-- name: jobs_release_claim
-- A batch whose claim (or whose connection) was lost before any of its sends began: whatever of
-- it is still this node's goes back as it was, not in doubt. Walks the small 'sending' index.
-- Put-backs to 'pending' are recorded as in jobs_release.
WITH released AS (
    UPDATE broadcast_jobs
       SET status = CASE WHEN attempts = 0 THEN 'pending' ELSE 'retry' END,
           claimed_by = NULL, claim_token = NULL, claimed_at = NULL, send_begun = NULL
     WHERE claimed_by = %(node_id)s AND status = 'sending' AND claim_token = %(claim_token)s
    RETURNING id, broadcast_id, next_attempt_at, status
), put_back AS (
    INSERT INTO claim_putbacks (broadcast_id, next_attempt_at, job_id)
    SELECT DISTINCT ON (broadcast_id) broadcast_id, next_attempt_at, id
      FROM released WHERE status = 'pending'
     ORDER BY broadcast_id, next_attempt_at, id
)
SELECT id FROM released;

-- ---------------------------------------------------------------------------------------------
-- Provider notifications: bounces, complaints, deliveries learnt after the send.

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

-- ---------------------------------------------------------------------------------------------
-- Operator views: suppressions, subscribers, the delivery log, nodes.

-- name: suppression_list
SELECT email, reason, code, diagnostic, source_broadcast_id, created_at
  FROM suppressions
 WHERE (%(reason)s::text IS NULL OR reason = %(reason)s)
   AND (%(search)s::text IS NULL OR email ILIKE '%%' || %(search)s || '%%')
 ORDER BY created_at, id;

-- name: suppression_remove
-- Only future campaigns are affected: nothing already failed as suppressed is sent again.
DELETE FROM suppressions WHERE lower(email) = lower(%(email)s) RETURNING email;

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

-- name: nodes_list
-- Live nodes and those seen in the last day, with their jobs in flight.
SELECT n.name, n.id, n.host, n.pid, n.started_at, n.stopped_at, n.config_digest,
       extract(epoch FROM now() - n.heartbeat_at)::float8 AS heartbeat_age,
       (SELECT count(*) FROM broadcast_jobs j WHERE j.status = 'sending' AND j.claimed_by = n.id) AS in_flight,
       n.stopped_at IS NULL AND n.heartbeat_at > now() - make_interval(secs => %(lease)s::float8) AS alive
  FROM nodes n
 WHERE n.stopped_at IS NULL OR n.heartbeat_at > now() - interval '1 day'
 ORDER BY n.started_at DESC;

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

-- ---------------------------------------------------------------------------------------------
-- Outgoing webhooks (docs/webhooks.md): the outbox, written with the facts, drained by the nodes.

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

-- name: webhook_due_exists
-- Whether any of these endpoints has an event to deliver now (its lease passed, if it had one),
-- unless its receiver turned it off.
SELECT EXISTS (SELECT FROM webhook_outbox o
                WHERE o.endpoint = ANY (%(endpoints)s::text[]) AND o.status = 'pending' AND o.next_attempt_at <= now()
                  AND NOT EXISTS (SELECT FROM webhook_endpoints d WHERE d.id = o.endpoint AND d.disabled_at IS NOT NULL));

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
