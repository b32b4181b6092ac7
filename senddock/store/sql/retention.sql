-- Retention: per-recipient history pruned once it is old enough, totals kept (migration 19).
-- Parameters are always bound (%(name)s).

-- name: retention_due_broadcasts
-- Ended campaigns whose broadcast's rows are older than the retention, oldest first.
SELECT c.id AS campaign_id
  FROM campaigns c
 WHERE c.status IN ('finished', 'cancelled') AND c.broadcast_id IS NOT NULL AND c.pruned_at IS NULL
   AND coalesce(c.finished_at, c.updated_at) < now() - make_interval(secs => %(keep)s::float8)
 ORDER BY coalesce(c.finished_at, c.updated_at), c.id;

-- name: retention_campaign_lock
-- The campaign, held while its rows go: a resume, requeue or delete waits for the prune.
SELECT id, name, status, broadcast_id, pruned_at FROM campaigns WHERE id = %(campaign_id)s FOR UPDATE;

-- name: retention_blockers
-- What must be done before a broadcast's rows may go: sends still in flight (a cancelled
-- campaign's last sends), and bounces not yet applied (their suppression is made from the job).
SELECT (SELECT coalesce(sum(n), 0) FROM tallies
         WHERE subject = 'jobs' AND key[1] = %(broadcast_id)s::bigint::text AND key[2] = 'sending')::bigint AS in_flight,
       (SELECT count(*) FROM pending_bounces WHERE broadcast_id = %(broadcast_id)s)
       + (SELECT count(*) FROM delivery_events
           WHERE broadcast_id = %(broadcast_id)s AND suppresses AND NOT hooks_done) AS unapplied_bounces;

-- name: retention_broadcast_rows
-- How many rows pruning the broadcast removes, table by table (jobs from the tallies), and the disk
-- its partitions hold (migration 20).
SELECT (SELECT coalesce(sum(n), 0) FROM tallies
         WHERE subject = 'jobs' AND key[1] = %(broadcast_id)s::bigint::text)::bigint AS broadcast_jobs,
       (SELECT count(*) FROM delivery_attempts WHERE broadcast_id = %(broadcast_id)s) AS delivery_attempts,
       (SELECT count(*) FROM delivery_events WHERE broadcast_id = %(broadcast_id)s) AS delivery_events,
       (SELECT count(*) FROM claim_floors WHERE broadcast_id = %(broadcast_id)s)
       + (SELECT count(*) FROM claim_putbacks WHERE broadcast_id = %(broadcast_id)s) AS claim_floors;

-- name: retention_freeze
UPDATE campaigns SET final_counts = %(counts)s, pruned_at = now(), updated_at = now()
 WHERE id = %(campaign_id)s
RETURNING pruned_at;

-- name: retention_remove_broadcast
-- In the freeze's transaction: the broadcast's rows outside its partitions (events are few: one
-- table, see migration 20), and its jobs' tallies (dropping the partitions fires no trigger).
WITH events AS (
    DELETE FROM delivery_events WHERE broadcast_id = %(broadcast_id)s RETURNING 1
), floors AS (
    DELETE FROM claim_floors WHERE broadcast_id = %(broadcast_id)s RETURNING 1
), putbacks AS (
    DELETE FROM claim_putbacks WHERE broadcast_id = %(broadcast_id)s RETURNING 1
), tallied AS (
    DELETE FROM tallies WHERE subject = 'jobs' AND key[1] = %(broadcast_id)s::bigint::text RETURNING 1
)
SELECT (SELECT count(*) FROM events) AS delivery_events,
       (SELECT count(*) FROM floors) + (SELECT count(*) FROM putbacks) AS claim_floors,
       (SELECT count(*) FROM tallied) AS tallies;

-- name: retention_partitions
-- A broadcast's partitions still there (attached, being detached, or detached and not dropped),
-- with their disk: what pruning it drops.
SELECT c.relname AS partition, parent.relname AS parent, i.inhdetachpending AS detaching,
       pg_total_relation_size(c.oid) AS bytes
  FROM (VALUES ('broadcast_jobs'), ('delivery_attempts')) AS p (parent_name)
  JOIN pg_class c ON c.relname = p.parent_name || '_b' || %(broadcast_id)s::bigint
                 AND c.relnamespace = 'public'::regnamespace
  LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
  LEFT JOIN pg_class parent ON parent.oid = i.inhparent
 ORDER BY 1;

-- name: retention_pruned_with_partitions
-- Campaigns pruned whose partitions are still there: a prune stopped between its commit and its
-- drops (a node killed), finished by the next.
SELECT c.id AS campaign_id, c.broadcast_id
  FROM campaigns c
 WHERE c.pruned_at IS NOT NULL
   AND (to_regclass('public.broadcast_jobs_b' || c.broadcast_id) IS NOT NULL
        OR to_regclass('public.delivery_attempts_b' || c.broadcast_id) IS NOT NULL)
 ORDER BY c.pruned_at;

-- name: retention_expire_inbound_mail
-- The record of bounce messages read longer ago than inbound_mail's retention (a message arriving
-- again after that is read as new: its bounce is applied once more, to the same effect).
WITH gone AS (
    DELETE FROM inbound_mail WHERE received_at < now() - make_interval(secs => %(keep)s::float8) RETURNING 1
)
SELECT count(*) FROM gone;

-- name: retention_count_inbound_mail
SELECT count(*) FROM inbound_mail WHERE received_at < now() - make_interval(secs => %(keep)s::float8);

-- name: retention_expire_campaign_events
WITH gone AS (
    DELETE FROM campaign_events WHERE at < now() - make_interval(secs => %(keep)s::float8) RETURNING 1
)
SELECT count(*) FROM gone;

-- name: retention_count_campaign_events
SELECT count(*) FROM campaign_events WHERE at < now() - make_interval(secs => %(keep)s::float8);
