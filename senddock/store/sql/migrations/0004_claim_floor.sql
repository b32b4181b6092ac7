-- senddock schema, version 4: where each broadcast's claims start, so that a claim costs the same
-- after a million drained jobs as after none, even while an old snapshot is open.
--
-- A claimed job's new row version leaves broadcast_jobs_pending_idx, but its old entry stays until
-- no snapshot can see the old version. While any older snapshot is open (a REPEATABLE READ report,
-- `campaign send` of another big campaign), those entries cannot be marked dead, and a claim that
-- walks the broadcast's pending jobs from the start steps over every job drained since. So claims
-- start at a floor instead: no pending job of the broadcast is ever below it.
--
-- Pending jobs are ordered by (next_attempt_at, id), and within one broadcast that is id order
-- (next_attempt_at is the enqueue time). Every poll, one node raises the floor to the lowest
-- pending key it sees (claim_floors_raise). Whatever puts a job back to 'pending' (a release, a
-- recovery, a pause outcome) records the job's key in claim_putbacks in the same statement; the
-- claim starts at the lower of the floor and those keys. Put-backs only insert: they never wait
-- for a lock, and no writer of broadcasts rows waits for them.

-- The floors, one live row per broadcast, the newest: a raise inserts the new floor and deletes the
-- one it replaces. Not a column of broadcasts: a row every claim reads and every poll updated would
-- keep every version while the old snapshot is open, and claims would walk them all (one more per
-- poll). Read newest first, the index walk stops at the first entry, the live one; replaced rows
-- are never visited. No row yet: the start is the broadcast's first entry ('-infinity', 0), so a
-- broadcast enqueued before this migration is claimed as before. 'infinity' once no pending job
-- is left.
CREATE TABLE claim_floors (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    broadcast_id  bigint NOT NULL,
    from_at       timestamptz NOT NULL,
    from_id       bigint NOT NULL
);
CREATE INDEX claim_floors_broadcast_idx ON claim_floors (broadcast_id, id);

-- Keys of jobs put back to 'pending' since the last raise, consumed by the next one. Few rows:
-- put-backs happen at shutdowns, pauses, lost connections and recoveries.
CREATE TABLE claim_putbacks (
    broadcast_id     bigint NOT NULL,
    next_attempt_at  timestamptz NOT NULL,
    job_id           bigint NOT NULL
);
CREATE INDEX claim_putbacks_idx ON claim_putbacks (broadcast_id, next_attempt_at, job_id);

-- Where a claim of each broadcast starts: the lower of its floor and its put-backs. The claim,
-- the finish check, the idle check and the raise itself read it; one definition, so none of them
-- can start above a pending job.
CREATE VIEW broadcast_claim_starts AS
SELECT b.id AS broadcast_id, s.from_at, s.from_id
  FROM broadcasts b
  LEFT JOIN LATERAL (
      SELECT f.from_at, f.from_id
        FROM claim_floors f
       WHERE f.broadcast_id = b.id
       ORDER BY f.id DESC
       LIMIT 1
  ) f ON true
 CROSS JOIN LATERAL (
     SELECT k.at AS from_at, k.id AS from_id
       FROM (SELECT coalesce(f.from_at, '-infinity') AS at, coalesce(f.from_id, 0) AS id
             UNION ALL
             (SELECT p.next_attempt_at, p.job_id
                FROM claim_putbacks p
               WHERE p.broadcast_id = b.id
               ORDER BY p.next_attempt_at, p.job_id
               LIMIT 1)) k
      ORDER BY k.at, k.id
      LIMIT 1
 ) s;
