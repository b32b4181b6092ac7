-- The shared rate limits. Parameters are always bound (%(name)s).

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
    JOIN broadcast_jobs j ON j.broadcast_id = a.broadcast_id AND j.id = a.job_id  -- its partition only
    JOIN broadcasts b ON b.id = a.broadcast_id
    WHERE a.started_at >= now() - interval '1 minute'
      -- Only the partitions of broadcasts that may have sent in the last minute (pruned when the
      -- statement runs): the ended ones' cost nothing, however many there are (migration 20).
      AND a.broadcast_id = ANY (ARRAY(SELECT c.broadcast_id FROM campaigns c
                                       WHERE c.broadcast_id IS NOT NULL
                                         AND (c.status NOT IN ('finished', 'cancelled')
                                              OR coalesce(c.finished_at, c.updated_at) > now() - interval '1 minute')))
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
