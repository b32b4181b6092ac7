-- Nodes: the server epoch, lifelines, names, heartbeats, settling after a failover, waits. Parameters are always bound (%(name)s).

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
-- time, the current one (a new node has nothing to settle). config_digest: see senddock.config.digest.
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

-- name: nodes_list
-- Live nodes and those seen in the last day, with their jobs in flight.
SELECT n.name, n.id, n.host, n.pid, n.started_at, n.stopped_at, n.config_digest,
       extract(epoch FROM now() - n.heartbeat_at)::float8 AS heartbeat_age,
       (SELECT count(*) FROM broadcast_jobs j WHERE j.status = 'sending' AND j.claimed_by = n.id) AS in_flight,
       n.stopped_at IS NULL AND n.heartbeat_at > now() - make_interval(secs => %(lease)s::float8) AS alive
  FROM nodes n
 WHERE n.stopped_at IS NULL OR n.heartbeat_at > now() - interval '1 day'
 ORDER BY n.started_at DESC;
