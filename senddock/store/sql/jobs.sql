-- The engine's queue: claims, results, recovery, breakers' pauses, finishing, bounce aftercare and tallies. Parameters are always bound (%(name)s).

-- name: campaigns_start_scheduled
-- From the poll of every node: scheduled campaigns whose time has come start sending.
UPDATE campaigns SET status = 'sending', started_at = now(), updated_at = now()
 WHERE status = 'scheduled' AND send_at <= now()
RETURNING id, broadcast_id;

-- name: jobs_claim_broadcasts
-- The broadcasts a claim may take jobs of: jobs_claim names them, so that it is planned over their
-- partitions only (migration 20), not over every broadcast ever sent.
SELECT broadcast_id FROM campaigns WHERE status = 'sending' AND broadcast_id IS NOT NULL ORDER BY broadcast_id;

-- name: notify_jobs
SELECT pg_notify('senddock_jobs', %(broadcast_id)s::text);

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
-- {b}: the broadcasts of jobs_claim_broadcasts, read just before, written in as literals
-- (queries.for_broadcasts): every reference to broadcast_jobs is pruned to their partitions when
-- the statement is planned (migration 20), and the plan psycopg prepares for that text can be kept.
-- A campaign that stopped sending since is still left out here; one that started waits for the next claim.
WITH running AS MATERIALIZED (
    SELECT c.id AS campaign_id, c.broadcast_id, c.send_rate, s.from_at, s.from_id
    FROM campaigns c
    JOIN broadcast_claim_starts s ON s.broadcast_id = c.broadcast_id
    WHERE c.status = 'sending' AND c.broadcast_id IN ({b})
      -- Nothing while a live node has not settled in the server's current epoch (migration 14):
      -- after a loss of WAL it may be the only one to know a job was sent (senddock.core.journal).
      -- A node that died with the old server is waited for until its lease has passed.
      AND NOT EXISTS (SELECT 1 FROM nodes n
                       WHERE n.stopped_at IS NULL AND n.settled_epoch IS NOT NULL
                         AND n.heartbeat_at > now() - make_interval(secs => %(lease)s::float8)
                         AND n.settled_epoch IS DISTINCT FROM (SELECT id FROM server_epoch))
    ORDER BY c.broadcast_id
), retries AS MATERIALIZED (
    SELECT j.id, r.broadcast_id, r.campaign_id, r.send_rate, j.email
    FROM running r
    CROSS JOIN LATERAL (
        SELECT j.id, j.email
        FROM broadcast_jobs j
        WHERE j.broadcast_id = r.broadcast_id AND j.broadcast_id IN ({b})
          AND j.status = 'retry' AND j.next_attempt_at <= now()
        ORDER BY j.next_attempt_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) j
    LIMIT %(limit)s
), fresh AS MATERIALIZED (
    SELECT j.id, r.broadcast_id, r.campaign_id, r.send_rate, j.email
    FROM running r
    CROSS JOIN LATERAL (
        SELECT j.id, j.email
        FROM broadcast_jobs j
        WHERE j.broadcast_id = r.broadcast_id AND j.broadcast_id IN ({b})
          AND j.status = 'pending'
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
    SELECT d.id, d.broadcast_id, d.campaign_id, d.send_rate,
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
 WHERE j.broadcast_id IN ({b}) AND j.broadcast_id = due.broadcast_id AND j.id = due.id
   AND s.id = j.subscriber_id
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
-- {b}: the broadcasts of the results and of begin_ids, as in jobs_claim (queries.for_broadcasts):
-- the three updates of broadcast_jobs are planned over their partitions only. (Types are spelt
-- short, a delay NULL by coalesce: the statement must stay under psycopg's 4 KB parse cache.)
WITH r AS (
    SELECT *
    FROM json_to_recordset(%(results)s::json)
         r (job_id int8, claim_token uuid, broadcast_id int8, campaign_id int8, email text, attempt int,
               status text, counts int, deferred int, delay float8, failure_reason text, last_result text,
               provider_message_id text, started_at timestamptz, outcome text, in_doubt bool, ok bool,
               phase text, code int, enhanced_code text, bounce bool, pause_reason text)
    LIMIT %(count)s
), result AS (
    UPDATE broadcast_jobs j
       SET status = r.status,
           attempts = j.attempts + r.counts,
           deferrals = j.deferrals + r.deferred,
           next_attempt_at = coalesce(now() + make_interval(secs => r.delay), j.next_attempt_at),
           failure_reason = r.failure_reason,
           last_result = r.last_result,
           sent_at = CASE WHEN r.status = 'sent' THEN now() END,
           provider_message_id = coalesce(r.provider_message_id, j.provider_message_id),
           first_attempt_at = coalesce(j.first_attempt_at, j.claimed_at),
           claimed_by = NULL, claim_token = NULL, send_begun = NULL
      FROM r
     WHERE j.broadcast_id IN ({b}) AND j.id = r.job_id AND j.claim_token = r.claim_token AND j.status = 'sending'
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
     WHERE j.broadcast_id IN ({b}) AND j.id = r.job_id AND r.ok AND j.status <> 'sent'
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
     WHERE j.broadcast_id IN ({b}) AND j.id = ANY (%(begin_ids)s::int8[]) AND j.status = 'sending'
       AND j.claim_token = (%(begin_tokens)s::uuid[])[array_position(%(begin_ids)s::int8[], j.id)]
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
       set_config('synchronous_commit', %(sync)s, true)
  FROM r LEFT JOIN result x ON x.id = r.job_id LEFT JOIN late l ON l.id = r.job_id;

-- name: jobs_results_recorded
-- After a lost connection or a server epoch change: which of these results did this node commit
-- (the reply was lost, or a Postgres crash may have lost the commit since)? Each send's attempt
-- row carries this node and the send's start time, so it identifies that one commit. Returns the
-- job ids found, with their claim_lost. {b}: the jobs' broadcasts (queries.for_broadcasts).
SELECT a.job_id, a.claim_lost
  FROM unnest(%(job_ids)s::bigint[], %(started_ats)s::timestamptz[]) AS r (job_id, started_at)
  JOIN delivery_attempts a ON a.broadcast_id IN ({b}) AND a.job_id = r.job_id AND a.node_id = %(node_id)s
                          AND a.started_at IS NOT DISTINCT FROM r.started_at;

-- name: jobs_begin
-- After the limits were taken for jobs claimed with send_begun = false: the admitted ones are
-- marked begun (this commit is synchronous: a send begins only after it), the held-back ones go
-- back to wait for their limit, as 'retry' due when it has room, with no attempt spent and nothing
-- in doubt (their send never began). Both fenced by the claim token. A job whose campaign stopped
-- sending since its claim (paused, cancelled: a job may wait on the deck) is neither: the caller
-- puts it back. {b}: the jobs' broadcasts (queries.for_broadcasts).
WITH begun AS (
    UPDATE broadcast_jobs j
       SET send_begun = true
      FROM campaigns c
     WHERE j.broadcast_id IN ({b}) AND j.id = ANY (%(begun_ids)s::bigint[]) AND j.claim_token = %(claim_token)s AND j.status = 'sending'
       AND c.broadcast_id = j.broadcast_id AND c.status = 'sending'
    RETURNING j.id
), held AS (
    UPDATE broadcast_jobs j
       SET status = 'retry', next_attempt_at = h.due_at, send_begun = NULL,
           claimed_by = NULL, claim_token = NULL, claimed_at = NULL
      FROM unnest(%(held_ids)s::bigint[], %(held_due)s::timestamptz[]) AS h (id, due_at)
     WHERE j.broadcast_id IN ({b}) AND j.id = h.id AND j.claim_token = %(claim_token)s AND j.status = 'sending'
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
-- like a claim. {b}: the jobs' broadcasts (queries.for_broadcasts).
WITH taken AS (
    UPDATE broadcast_jobs j
       SET status = 'sending', claimed_by = %(node_id)s, claim_token = r.token,
           claimed_at = coalesce(j.claimed_at, now()), send_begun = true,
           claim_epoch = CASE WHEN %(async_results)s THEN (SELECT id FROM server_epoch) END
      FROM unnest(%(job_ids)s::bigint[], %(tokens)s::uuid[]) AS r (id, token)
     WHERE j.broadcast_id IN ({b}) AND j.id = r.id
       AND (j.status IN ('pending', 'retry')
            OR (j.status = 'sending' AND j.claim_token = r.token AND j.send_begun IS NOT TRUE))
    RETURNING j.id
), durable AS (
    SELECT set_config('synchronous_commit', 'on', true)
)
SELECT (SELECT array_agg(id) FROM taken), (SELECT 1 FROM durable);

-- name: jobs_open_broadcasts
-- The broadcasts that may have jobs 'sending': those of every campaign not finished (paused ones
-- too: their jobs in flight end later), and of a cancelled one while the tallies count some of its
-- jobs 'sending' (its last sends; cancelled campaigns only add up over the years). A finished
-- campaign has none: campaigns_finish waits for them. What recovery and the in-flight count name,
-- so as to skip the partitions of broadcasts that ended (migration 20).
SELECT c.broadcast_id FROM campaigns c
 WHERE c.broadcast_id IS NOT NULL AND c.status NOT IN ('finished', 'cancelled')
UNION
SELECT c.broadcast_id FROM campaigns c
 WHERE c.broadcast_id IS NOT NULL AND c.status = 'cancelled'
   AND EXISTS (SELECT FROM tallies t
                WHERE t.subject = 'jobs' AND t.key[1] = c.broadcast_id::text AND t.key[2] = 'sending'
                GROUP BY t.key HAVING sum(t.n) > 0)
ORDER BY 1;

-- name: jobs_in_flight_by_domain
-- Sends in flight in the whole cluster (marked begun, not recorded), by recipient domain: what
-- a domain group's `concurrency` counts. Walks the small 'sending' index only, of the broadcasts
-- of jobs_open_broadcasts ({b}, as in jobs_claim).
SELECT domain, count(*) FROM broadcast_jobs WHERE broadcast_id IN ({b}) AND status = 'sending' AND send_begun
 GROUP BY domain;

-- name: concurrency_locks
-- One transaction-scoped lock per domain group with a concurrency limit, taken in key order (no
-- two nodes wait for each other in a cycle) and held until the begin marks commit: two nodes never
-- count the same free room.
SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(k)) FROM unnest(%(keys)s::text[]) AS k ORDER BY k;

-- name: jobs_release
-- Claimed jobs that were never started go back as they were (a shutdown, a pause, a lost claim).
-- The lowest key going back to 'pending' in each broadcast is recorded in the same statement, so
-- no claim starts above it (migration 4). {b}: the jobs' broadcasts (queries.for_broadcasts).
WITH released AS (
    UPDATE broadcast_jobs j
       SET status = CASE WHEN j.attempts = 0 THEN 'pending' ELSE 'retry' END,
           claimed_by = NULL, claim_token = NULL, claimed_at = NULL, send_begun = NULL
      FROM unnest(%(job_ids)s::bigint[], %(claim_tokens)s::uuid[]) AS r(id, token)
     WHERE j.broadcast_id IN ({b}) AND j.id = r.id AND j.claim_token = r.token AND j.status = 'sending'
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
-- recorded as such, then retried or failed; the others go back as they were. Only the partitions of
-- jobs_open_broadcasts are looked in ({b}, as in jobs_claim): no other broadcast has a job 'sending'.
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
    WHERE j.broadcast_id IN ({b}) AND j.status = 'sending'
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
     WHERE j.broadcast_id IN ({b}) AND j.id = v.id AND j.status = 'sending' AND j.claim_token = v.claim_token
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

-- name: campaign_cancel_leftovers_broadcasts
-- Cancelled campaigns with jobs put back since the cancel (pending or retry): read from the
-- tallies, so the poll that runs it every time touches no job, however many were ever cancelled.
SELECT c.broadcast_id FROM campaigns c
 WHERE c.status = 'cancelled' AND c.broadcast_id IS NOT NULL
   AND EXISTS (SELECT FROM tallies t
                WHERE t.subject = 'jobs' AND t.key[1] = c.broadcast_id::text AND t.key[2] IN ('pending', 'retry')
                GROUP BY t.key HAVING sum(t.n) > 0)
 ORDER BY 1;

-- name: campaign_cancel_leftovers
-- Those jobs failed as cancelled, the broadcasts named ({b}: their partitions only), each status
-- through its own partial index.
UPDATE broadcast_jobs j SET status = 'failed', failure_reason = 'cancelled'
  FROM (SELECT broadcast_id, id FROM broadcast_jobs WHERE broadcast_id IN ({b}) AND status = 'pending'
        UNION ALL
        SELECT broadcast_id, id FROM broadcast_jobs WHERE broadcast_id IN ({b}) AND status = 'retry') l
 WHERE j.broadcast_id IN ({b}) AND j.broadcast_id = l.broadcast_id AND j.id = l.id
   AND j.status IN ('pending', 'retry')
RETURNING j.id;

-- name: campaigns_finish
-- A campaign stays 'sending' until every job of its broadcast is sent or failed. Run after result
-- commits and from the poll: whoever commits the last result sees all others' commits.
UPDATE campaigns c
   SET status = 'finished', finished_at = now(), updated_at = now()
 WHERE c.status = 'sending'
   -- {b}: the broadcast whose results were committed, or those sending (jobs_claim_broadcasts),
   -- as in jobs_claim (queries.for_broadcasts): each probe is planned over their partitions only.
   AND c.broadcast_id IN ({b})
   -- One probe per unfinished state, each answered by its own small partial index. Pending jobs
   -- are looked for from the claim start (none is below it) in index order, as a claim would: not
   -- over the leftover entries of every job drained while a snapshot is open.
   AND NOT EXISTS (SELECT 1 FROM broadcast_claim_starts s
                    CROSS JOIN LATERAL (SELECT 1 FROM broadcast_jobs j
                                         WHERE j.broadcast_id = s.broadcast_id AND j.broadcast_id IN ({b})
                                           AND j.status = 'pending'
                                           AND (j.next_attempt_at, j.id) >= (s.from_at, s.from_id)
                                         ORDER BY j.next_attempt_at, j.id LIMIT 1) j
                    WHERE s.broadcast_id = c.broadcast_id)
   AND NOT EXISTS (SELECT 1 FROM broadcast_jobs j WHERE j.broadcast_id = c.broadcast_id AND j.broadcast_id IN ({b})
                                                    AND j.status = 'retry')
   AND NOT EXISTS (SELECT 1 FROM broadcast_jobs j WHERE j.broadcast_id = c.broadcast_id AND j.broadcast_id IN ({b})
                                                    AND j.status = 'sending')
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
-- it replaces is deleted (see migration 4 for why it is not updated in place). {b}: broadcast_ids
-- again, written in (queries.for_broadcasts): the walk is planned over their partitions only.
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
           WHERE j.broadcast_id = st.broadcast_id AND j.broadcast_id IN ({b}) AND j.status = 'pending'
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
-- Pending jobs from the claim start, in index order, as the claim looks for them. {b}: the
-- broadcasts sending (jobs_claim_broadcasts), as in jobs_claim.
SELECT EXISTS (
    SELECT 1 FROM campaigns c
    WHERE c.status = 'sending' AND c.broadcast_id IN ({b})
      AND (EXISTS (SELECT 1 FROM broadcast_claim_starts s
                    CROSS JOIN LATERAL (SELECT 1 FROM broadcast_jobs j
                                         WHERE j.broadcast_id = s.broadcast_id AND j.broadcast_id IN ({b})
                                           AND j.status = 'pending'
                                           AND (j.next_attempt_at, j.id) >= (s.from_at, s.from_id)
                                         ORDER BY j.next_attempt_at, j.id LIMIT 1) j
                    WHERE s.broadcast_id = c.broadcast_id)
           OR EXISTS (SELECT 1 FROM broadcast_jobs j WHERE j.broadcast_id = c.broadcast_id
                      AND j.broadcast_id IN ({b}) AND j.status = 'retry' AND j.next_attempt_at <= now()))
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

-- name: jobs_release_claim
-- A batch whose claim (or whose connection) was lost before any of its sends began: whatever of
-- it is still this node's goes back as it was, not in doubt. Walks the small 'sending' index.
-- Put-backs to 'pending' are recorded as in jobs_release. {b}: jobs_open_broadcasts, as in jobs_recover.
WITH released AS (
    UPDATE broadcast_jobs
       SET status = CASE WHEN attempts = 0 THEN 'pending' ELSE 'retry' END,
           claimed_by = NULL, claim_token = NULL, claimed_at = NULL, send_begun = NULL
     WHERE broadcast_id IN ({b}) AND claimed_by = %(node_id)s AND status = 'sending' AND claim_token = %(claim_token)s
    RETURNING id, broadcast_id, next_attempt_at, status
), put_back AS (
    INSERT INTO claim_putbacks (broadcast_id, next_attempt_at, job_id)
    SELECT DISTINCT ON (broadcast_id) broadcast_id, next_attempt_at, id
      FROM released WHERE status = 'pending'
     ORDER BY broadcast_id, next_attempt_at, id
)
SELECT id FROM released;

-- name: webhook_due_exists
-- Whether any of these endpoints has an event to deliver now (its lease passed, if it had one),
-- unless its receiver turned it off.
SELECT EXISTS (SELECT FROM webhook_outbox o
                WHERE o.endpoint = ANY (%(endpoints)s::text[]) AND o.status = 'pending' AND o.next_attempt_at <= now()
                  AND NOT EXISTS (SELECT FROM webhook_endpoints d WHERE d.id = o.endpoint AND d.disabled_at IS NOT NULL));
