-- senddock schema, version 7: rate limits shared by every node (pacing).
--
-- One row per limit (`global`, `transport:smtp`, `domain:gmail.com`, `campaign:12`): the GCRA's
-- theoretical arrival time, when the next send would be due if sends kept exactly to the rate.
-- A send is allowed at t while tat - t <= tau (the burst tolerance), and each one moves tat on by
-- the emission interval T. The rate itself is not stored: it comes with every take, from the
-- config or the campaign, so a changed rate applies at once. A row is created on its first take
-- (pacing_take); the one value per limit is all a cluster needs to share, no leader, no tokens.
CREATE TABLE pacing_limits (
    key         text PRIMARY KEY,
    tat         timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()  -- the last take that admitted a send
);
