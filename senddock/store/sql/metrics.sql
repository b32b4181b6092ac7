-- Cluster-wide metrics read by /metrics. Parameters are always bound (%(name)s).

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
