-- senddock schema, version 20: a broadcast's jobs and attempts in partitions of their own.
--
-- broadcast_jobs and delivery_attempts are partitioned by broadcast (LIST, one partition each,
-- named broadcast_jobs_bN and delivery_attempts_bN), so that the per-recipient rows of an ended
-- broadcast can go whole (DETACH PARTITION ... CONCURRENTLY, then DROP TABLE: the disk comes back
-- at once, with no dead tuples and no VACUUM debt) instead of row by row. The primary keys now
-- include broadcast_id, as every unique constraint of a partitioned table must; ids still come
-- from one sequence per parent, so they stay unique and increasing across partitions. The
-- partitions are data, not schema: schema.sql shows the parents only.
--
-- A broadcast's partitions are made by a trigger on broadcasts, in the transaction that creates
-- the broadcast (campaign send): every broadcast has them, whoever inserts it. They are made with
-- CREATE TABLE ... (LIKE parent) and then ATTACH PARTITION, not CREATE TABLE ... PARTITION OF: on
-- PostgreSQL 15 (read from pg_locks) PARTITION OF takes ACCESS EXCLUSIVE on the parent, which
-- would wait for every node's claim and result commit and block them behind it, where ATTACH takes
-- SHARE UPDATE EXCLUSIVE, which conflicts with no DML (two campaign sends, or a send and a
-- prune's DETACH, take turns). Storage parameters are per partition (a partitioned table has no
-- heap): the jobs' fillfactor and autovacuum settings of migration 1 are set on each.
--
-- delivery_events stays one table, pruned by batched deletes on delivery_events_broadcast_idx:
-- its UNIQUE (event_key) is what makes ingest idempotent, and a partitioned table cannot keep a
-- key unique across partitions unless the key holds broadcast_id, which an event does not know
-- before it is matched (and may never: broadcast_id is NULL for events about no job of ours). Its
-- rows are a few per cent of the jobs', so deleting them in batches leaves little for autovacuum.
--
-- The upgrade moves existing rows in this one transaction, holding ACCESS EXCLUSIVE on both tables
-- while it runs: stop the nodes first (the rows are copied once and their indexes built after, so
-- the lock lasts about as long as a copy of the two tables).

CREATE FUNCTION senddock_broadcast_partitions(broadcast bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    parent text;
    options text;
BEGIN
    FOREACH parent IN ARRAY ARRAY['broadcast_jobs', 'delivery_attempts'] LOOP
        CONTINUE WHEN to_regclass(format('%I', parent || '_b' || broadcast)) IS NOT NULL;
        -- Jobs are updated twice or more each: room on the page for their new versions, and an
        -- early vacuum (migration 1). Attempts are only ever appended.
        options := CASE parent WHEN 'broadcast_jobs'
                        THEN ' WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, '
                             'autovacuum_analyze_scale_factor = 0.02)'
                        ELSE '' END;
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)%s',
                       parent || '_b' || broadcast, parent, options);
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES IN (%s)',
                       parent, parent || '_b' || broadcast, broadcast);
    END LOOP;
END
$$;

CREATE FUNCTION senddock_broadcast_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM senddock_broadcast_partitions(NEW.id);
    RETURN NULL;
END
$$;

-- Today's tables step aside: their names, their indexes' and their sequences' go to the new ones.
ALTER TABLE broadcast_jobs RENAME TO broadcast_jobs_unpartitioned;
ALTER TABLE broadcast_jobs_unpartitioned DROP CONSTRAINT broadcast_jobs_pkey,
    DROP CONSTRAINT broadcast_jobs_broadcast_id_subscriber_id_key;
DROP INDEX broadcast_jobs_pending_idx, broadcast_jobs_provider_message_id_idx, broadcast_jobs_retry_idx,
    broadcast_jobs_sending_broadcast_idx, broadcast_jobs_sending_idx;
ALTER SEQUENCE broadcast_jobs_id_seq RENAME TO broadcast_jobs_unpartitioned_id_seq;
DROP TRIGGER tallies_jobs_deleted ON broadcast_jobs_unpartitioned;
DROP TRIGGER tallies_jobs_inserted ON broadcast_jobs_unpartitioned;
DROP TRIGGER tallies_jobs_updated ON broadcast_jobs_unpartitioned;
DROP FUNCTION tallies_job_key(broadcast_jobs_unpartitioned);

ALTER TABLE delivery_attempts RENAME TO delivery_attempts_unpartitioned;
ALTER TABLE delivery_attempts_unpartitioned DROP CONSTRAINT delivery_attempts_pkey;
DROP INDEX delivery_attempts_broadcast_idx, delivery_attempts_job_idx, delivery_attempts_started_brin;
ALTER SEQUENCE delivery_attempts_id_seq RENAME TO delivery_attempts_unpartitioned_id_seq;

CREATE TABLE broadcast_jobs (
    id                   bigint GENERATED ALWAYS AS IDENTITY,
    broadcast_id         bigint NOT NULL,
    subscriber_id        bigint NOT NULL,
    email                text NOT NULL,
    domain               text NOT NULL,
    status               text NOT NULL DEFAULT 'pending',
    attempts             integer NOT NULL DEFAULT 0,
    rescues              integer NOT NULL DEFAULT 0,
    next_attempt_at      timestamptz NOT NULL DEFAULT now(),
    claimed_by           uuid,
    claimed_at           timestamptz,
    claim_token          uuid,
    first_attempt_at     timestamptz,
    provider_message_id  text,
    last_result          text,
    failure_reason       text,
    sent_at              timestamptz,
    claim_epoch          uuid,
    deferrals            integer NOT NULL DEFAULT 0,
    send_begun           boolean,
    CONSTRAINT broadcast_jobs_status_check
        CHECK (status IN ('pending', 'sending', 'retry', 'sent', 'failed'))
) PARTITION BY LIST (broadcast_id);

CREATE TABLE delivery_attempts (
    id                   bigint GENERATED ALWAYS AS IDENTITY,
    job_id               bigint NOT NULL,
    broadcast_id         bigint NOT NULL,
    attempt              integer NOT NULL,
    node                 text,
    node_id              uuid,
    started_at           timestamptz,
    finished_at          timestamptz NOT NULL DEFAULT now(),
    outcome              text NOT NULL,
    in_doubt             boolean NOT NULL DEFAULT false,
    phase                text,
    smtp_code            integer,
    enhanced_code        text,
    message              text,
    provider_message_id  text,
    claim_lost           boolean NOT NULL DEFAULT false
) PARTITION BY LIST (broadcast_id);

-- A partition for every broadcast there is, even one with no rows left, then the rows, with their
-- ids. The indexes are built after the copy (one sort each, not row by row), before any partition
-- made later: ATTACH makes a new partition's indexes from the parent's.
SELECT senddock_broadcast_partitions(b.id)
  FROM (SELECT id FROM broadcasts
        UNION SELECT broadcast_id FROM broadcast_jobs_unpartitioned
        UNION SELECT broadcast_id FROM delivery_attempts_unpartitioned) b
 ORDER BY b.id;

INSERT INTO broadcast_jobs OVERRIDING SYSTEM VALUE
SELECT id, broadcast_id, subscriber_id, email, domain, status, attempts, rescues, next_attempt_at, claimed_by,
       claimed_at, claim_token, first_attempt_at, provider_message_id, last_result, failure_reason, sent_at,
       claim_epoch, deferrals, send_begun
  FROM broadcast_jobs_unpartitioned;

INSERT INTO delivery_attempts OVERRIDING SYSTEM VALUE
SELECT id, job_id, broadcast_id, attempt, node, node_id, started_at, finished_at, outcome, in_doubt, phase,
       smtp_code, enhanced_code, message, provider_message_id, claim_lost
  FROM delivery_attempts_unpartitioned;

-- The sequences go on from where the old ones were (ids never reused, even those of rolled-back
-- inserts), then the old tables and their sequences go.
SELECT setval(pg_get_serial_sequence('broadcast_jobs', 'id'), last_value, is_called)
  FROM broadcast_jobs_unpartitioned_id_seq;
SELECT setval(pg_get_serial_sequence('delivery_attempts', 'id'), last_value, is_called)
  FROM delivery_attempts_unpartitioned_id_seq;
DROP TABLE broadcast_jobs_unpartitioned, delivery_attempts_unpartitioned;

-- The same keys and indexes as before, per partition. (id, broadcast_id): a lookup by id alone is
-- still an index scan in each partition.
ALTER TABLE broadcast_jobs ADD CONSTRAINT broadcast_jobs_pkey PRIMARY KEY (id, broadcast_id),
    ADD CONSTRAINT broadcast_jobs_broadcast_id_subscriber_id_key UNIQUE (broadcast_id, subscriber_id);
CREATE INDEX broadcast_jobs_pending_idx ON broadcast_jobs (broadcast_id, next_attempt_at, id)
    WHERE status = 'pending';
CREATE INDEX broadcast_jobs_retry_idx ON broadcast_jobs (broadcast_id, next_attempt_at) WHERE status = 'retry';
CREATE INDEX broadcast_jobs_sending_idx ON broadcast_jobs (claimed_by) WHERE status = 'sending';
CREATE INDEX broadcast_jobs_sending_broadcast_idx ON broadcast_jobs (broadcast_id) WHERE status = 'sending';
CREATE INDEX broadcast_jobs_provider_message_id_idx ON broadcast_jobs (provider_message_id)
    WHERE provider_message_id IS NOT NULL;

ALTER TABLE delivery_attempts ADD CONSTRAINT delivery_attempts_pkey PRIMARY KEY (id, broadcast_id);
CREATE INDEX delivery_attempts_job_idx ON delivery_attempts (job_id);
CREATE INDEX delivery_attempts_broadcast_idx ON delivery_attempts (broadcast_id, id);
CREATE INDEX delivery_attempts_started_brin ON delivery_attempts USING brin (started_at);

-- The tallies (migration 11) already count the rows moved: their triggers come back after the copy.
CREATE FUNCTION tallies_job_key(j broadcast_jobs) RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY[j.broadcast_id::text, j.status,
                 CASE WHEN j.status = 'failed' THEN coalesce(j.failure_reason, 'unknown') ELSE '' END]
$$;
CREATE TRIGGER tallies_jobs_inserted AFTER INSERT ON broadcast_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_jobs_changed();
CREATE TRIGGER tallies_jobs_updated AFTER UPDATE ON broadcast_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_jobs_changed();
CREATE TRIGGER tallies_jobs_deleted AFTER DELETE ON broadcast_jobs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_jobs_changed();

CREATE TRIGGER broadcasts_partitions AFTER INSERT ON broadcasts
    FOR EACH ROW EXECUTE FUNCTION senddock_broadcast_added();
