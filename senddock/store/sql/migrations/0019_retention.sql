-- senddock schema, version 19: a campaign keeps its final counts once its broadcast's
-- per-recipient rows are pruned (retention.broadcasts, `senddock prune`).
--
-- pruned_at: when the rows went (NULL: they are there). final_counts: the broadcast's counts as
-- `campaign status` showed them just before (the broadcast_counts query's columns, as JSON), read
-- from here ever after: status, ls, the dashboard and /metrics show the same figures after.
ALTER TABLE campaigns ADD COLUMN pruned_at timestamptz, ADD COLUMN final_counts jsonb;
ALTER TABLE campaigns ADD CONSTRAINT campaigns_pruned_check
    CHECK ((pruned_at IS NULL) = (final_counts IS NULL) AND (pruned_at IS NULL OR status IN ('finished', 'cancelled')));
