-- senddock schema, version 6: every change of a campaign's status, recorded in the transaction
-- that made it.
--
-- A pause the engine decides (relay trouble, bounce rate, a template error) must be loud: `campaign
-- status` shows when and by whom, and the outgoing webhooks read these rows (campaign_paused,
-- campaign_finished...). A trigger rather than one INSERT per query: every path that changes a
-- status (today's queries and any added later) is recorded, in the same transaction, or not at all.
CREATE TABLE campaign_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id  bigint NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
    at           timestamptz NOT NULL DEFAULT now(),
    from_status  text,
    to_status    text NOT NULL,
    reason       text,           -- paused_reason of a pause
    auto_resume  boolean NOT NULL DEFAULT false,
    actor        text            -- application_name of the session: `senddock-run NODE` or the CLI
);
CREATE INDEX campaign_events_campaign_idx ON campaign_events (campaign_id, id);

CREATE FUNCTION senddock_campaign_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_events (campaign_id, from_status, to_status, reason, auto_resume, actor)
    VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status,
            CASE WHEN NEW.status = 'paused' THEN NEW.paused_reason END,
            NEW.status = 'paused' AND NEW.auto_resume,
            nullif(current_setting('application_name', true), ''));
    RETURN NULL;
END
$$;

-- A pause that turns into another pause (relay trouble, then a person's pause) is an event too.
CREATE TRIGGER campaigns_status_event
    AFTER UPDATE OF status, paused_reason ON campaigns
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR (NEW.status = 'paused' AND OLD.paused_reason IS DISTINCT FROM NEW.paused_reason))
    EXECUTE FUNCTION senddock_campaign_event();
