-- senddock schema, version 8: sends in flight marked as begun, adaptive pacing, campaign rates.

-- A node sends many jobs at once (`concurrency`), so a batch's order no longer says which of its
-- jobs may be sending. A job's send begins only after a synchronous commit set send_begun: after
-- a crash the jobs in doubt are exactly those still 'sending' with send_begun. false: claimed and
-- held back (pacing) or not handed to a sender yet, never in doubt. NULL: claimed by a node of an
-- earlier version, whose batches send in id order (the lowest-id job still 'sending' is in doubt).
ALTER TABLE broadcast_jobs ADD COLUMN send_begun boolean;

-- Adaptive pacing (AIMD): a limit's rate is its configured rate times factor (0 < factor <= 1).
-- A throttling reply halves the factor; it grows back additively with time since factor_at
-- while no throttling is reported. Shared by every node like the limit itself.
ALTER TABLE pacing_limits
    ADD COLUMN factor float8 NOT NULL DEFAULT 1 CHECK (factor > 0 AND factor <= 1),
    ADD COLUMN factor_at timestamptz;

-- A campaign's own rate (`campaign create --rate`, `campaign set-rate`), e.g. '100/min': the
-- limit `campaign:ID`, read by the claimer with the campaign, so a change applies at once.
ALTER TABLE campaigns ADD COLUMN send_rate text;
