-- senddock schema, version 11: tallies, the cluster's counts kept as they change.
--
-- `senddock serve`'s /metrics reports jobs per campaign and status, bounces by kind and source and
-- suppressions by reason at every scrape. Counting broadcast_jobs then would scan a million rows
-- a scrape; instead statement-level triggers add each statement's net change here, in the
-- statement's own transaction, so a tally is exactly the committed rows (an aborted claim counts
-- nothing). Reading them is a sum over a few rows per key.
--
-- One row per key and backend (shard = pg_backend_pid()): two nodes committing results for the
-- same campaign never wait on each other's tally row. Rows of backends that ended are folded into
-- shard 0 by tallies_fold (run by every node now and then), so the table stays a few rows per key.
--
-- subject    key
-- 'jobs'     {broadcast_id, status, failure reason of a failed job, '' otherwise}
-- 'bounces'  {kind: hard | soft | complaint, source: ses | mail | ... (what the event key starts with)}
-- 'suppressions' {reason}
CREATE TABLE tallies (
    subject  text NOT NULL,
    key      text[] NOT NULL,
    shard    integer NOT NULL,
    n        bigint NOT NULL,
    PRIMARY KEY (subject, key, shard)
);

-- Each statement's change is -1 for every row before and +1 for every row after, summed per key:
-- an UPDATE that leaves a job's status as it was adds nothing, and needs no join of old to new.
-- Rows are upserted in key order, so two transactions that share a shard (a reused pid) lock them
-- in the same order.
CREATE FUNCTION tallies_job_key(j broadcast_jobs) RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY[j.broadcast_id::text, j.status,
                 CASE WHEN j.status = 'failed' THEN coalesce(j.failure_reason, 'unknown') ELSE '' END]
$$;

CREATE FUNCTION tallies_jobs_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tallies AS t (subject, key, shard, n)
        SELECT 'jobs', tallies_job_key(r), pg_backend_pid(), count(*)
          FROM new_rows r GROUP BY 2 ORDER BY 2
        ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO tallies AS t (subject, key, shard, n)
        SELECT 'jobs', tallies_job_key(r), pg_backend_pid(), -count(*)
          FROM old_rows r GROUP BY 2 ORDER BY 2
        ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + excluded.n;
    ELSE
        INSERT INTO tallies AS t (subject, key, shard, n)
        SELECT 'jobs', c.key, pg_backend_pid(), sum(c.n)
          FROM (SELECT tallies_job_key(o) AS key, -1 AS n FROM old_rows o
                UNION ALL
                SELECT tallies_job_key(r), 1 FROM new_rows r) c
         GROUP BY c.key HAVING sum(c.n) <> 0 ORDER BY c.key
        ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tallies_jobs_inserted AFTER INSERT ON broadcast_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_jobs_changed();
CREATE TRIGGER tallies_jobs_updated AFTER UPDATE ON broadcast_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_jobs_changed();
CREATE TRIGGER tallies_jobs_deleted AFTER DELETE ON broadcast_jobs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_jobs_changed();

-- Bounces and complaints that came back (SES notifications, bounces by mail); deliveries are not
-- counted. A bounce refused at send time is a failed job with reason 'bounced' (subject 'jobs').
CREATE FUNCTION tallies_event_key(e delivery_events) RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY[CASE WHEN e.kind = 'complaint' THEN 'complaint'
                      WHEN e.bounce_type = 'Permanent' THEN 'hard' ELSE 'soft' END,
                 split_part(e.event_key, ':', 1)]
$$;

CREATE FUNCTION tallies_events_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tallies AS t (subject, key, shard, n)
    SELECT 'bounces', tallies_event_key(r), pg_backend_pid(), count(*)
      FROM new_rows r WHERE r.kind IN ('bounce', 'complaint') GROUP BY 2 ORDER BY 2
    ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + excluded.n;
    RETURN NULL;
END
$$;

CREATE TRIGGER tallies_events_inserted AFTER INSERT ON delivery_events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_events_added();

CREATE FUNCTION tallies_suppressions_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tallies AS t (subject, key, shard, n)
        SELECT 'suppressions', ARRAY[r.reason], pg_backend_pid(), count(*)
          FROM new_rows r GROUP BY 2 ORDER BY 2
        ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO tallies AS t (subject, key, shard, n)
        SELECT 'suppressions', ARRAY[r.reason], pg_backend_pid(), -count(*)
          FROM old_rows r GROUP BY 2 ORDER BY 2
        ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + excluded.n;
    ELSE
        INSERT INTO tallies AS t (subject, key, shard, n)
        SELECT 'suppressions', ARRAY[c.reason], pg_backend_pid(), sum(c.n)
          FROM (SELECT o.reason, -1 AS n FROM old_rows o UNION ALL SELECT r.reason, 1 FROM new_rows r) c
         GROUP BY 2 HAVING sum(c.n) <> 0 ORDER BY 2
        ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tallies_suppressions_inserted AFTER INSERT ON suppressions
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_suppressions_changed();
CREATE TRIGGER tallies_suppressions_updated AFTER UPDATE ON suppressions
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_suppressions_changed();
CREATE TRIGGER tallies_suppressions_deleted AFTER DELETE ON suppressions
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_suppressions_changed();

-- What is already there, counted once (the migration's one scan), in shard 0.
INSERT INTO tallies (subject, key, shard, n)
SELECT 'jobs', tallies_job_key(j), 0, count(*) FROM broadcast_jobs j GROUP BY 2;
INSERT INTO tallies (subject, key, shard, n)
SELECT 'bounces', tallies_event_key(e), 0, count(*) FROM delivery_events e
 WHERE e.kind IN ('bounce', 'complaint') GROUP BY 2;
INSERT INTO tallies (subject, key, shard, n)
SELECT 'suppressions', ARRAY[reason], 0, count(*) FROM suppressions GROUP BY 2;
