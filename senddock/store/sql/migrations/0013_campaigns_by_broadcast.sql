-- senddock schema, version 13: a campaign found by its broadcast.
--
-- The group commit marks jobs begun only while their campaign sends, and the claim reads each
-- broadcast's campaign: both join broadcast_jobs to campaigns by broadcast_id. Without this index
-- that join scanned every campaign ever made, once per job marked: with 5,000 finished campaigns a
-- commit of 100 marks with 600 jobs in flight took 34 ms, against 5.8 ms with none.
CREATE INDEX campaigns_broadcast_idx ON campaigns (broadcast_id);
