-- senddock schema, version 3: knowing when the server lost the end of its WAL.
--
-- Results commit asynchronously by default, so a Postgres crash-restart (or a failover to a
-- standby) can lose the last fraction of a second of them. pg_postmaster_start_time() cannot
-- tell: a crash-restart keeps the postmaster, and a promoted standby started long before. An
-- UNLOGGED table can: crash recovery empties it, and it is empty on a promoted standby, while a
-- clean shutdown and restart keeps its rows. Its one row names the current epoch; the first
-- connection that finds it empty starts a new one (server_epoch_ensure).
CREATE UNLOGGED TABLE server_epoch (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    id          uuid NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now()
);

-- The epoch a batch was claimed in: a job still 'sending' under an earlier epoch may have had its
-- result lost, whatever its place in the batch, so recovery treats it as in doubt.
ALTER TABLE broadcast_jobs ADD COLUMN claim_epoch uuid;
