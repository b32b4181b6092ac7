-- senddock schema, version 14: no claims in a new server epoch until every live node has settled.
--
-- A failover to an asynchronous standby (or a crash that lost WAL) can lose claims, begin marks
-- and results a live node still knows of. Each node re-applies what it remembers (senddock.core.
-- journal) and then records the epoch it settled in; a claim takes nothing while a live node (a
-- heartbeat within the lease) has not settled in the current epoch. NULL: a node of an earlier
-- senddock, which knows nothing of this and is not waited for.
ALTER TABLE nodes ADD COLUMN settled_epoch uuid;

-- What every claim asks: the live nodes that take part, by heartbeat (not every incarnation ever).
CREATE INDEX nodes_live_idx ON nodes (heartbeat_at) WHERE stopped_at IS NULL AND settled_epoch IS NOT NULL;
