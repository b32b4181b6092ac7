-- senddock schema, version 9: delivery attempts by time.
--
-- Pacing status (`senddock status`, `campaign status`, run by `--watch` every refresh) counts the
-- sends begun in the last minute. delivery_attempts is append-only and written in time order, so
-- a BRIN index (a few kB for millions of rows) finds the last minute's pages without scanning the
-- table.
CREATE INDEX delivery_attempts_started_brin ON delivery_attempts USING brin (started_at);
