-- senddock schema, version 18: each list's members by status, kept in the tallies.
--
-- `lists ls` counted every member of every list (2.5-3.8 s with a list of 2,000,000). The
-- tallies (version 11) now also keep, per list and subscriber status, how many members it has:
--
-- subject    key
-- 'members'  {list_id, subscriber status: active | unsubscribed | blocklisted}
--
-- Memberships are only ever added (imports, `subscribers add`) or removed (none today); a
-- subscriber's status changes one row at a time (an unsubscribe, a blocklisting). A membership
-- and a status change at the same moment must not count the old status: the status change takes
-- FOR UPDATE on its subscriber, which waits for the foreign-key check's FOR KEY SHARE of a
-- membership being added (and makes that check wait), so whichever commits second sees the other.
-- (FOR SHARE on the members' subscribers instead cost an import of 200,000 1.5 s.)
CREATE FUNCTION tallies_members_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tallies AS t (subject, key, shard, n)
        SELECT 'members', ARRAY[x.list_id::text, x.status], pg_backend_pid(), count(*)
          FROM (SELECT r.list_id, s.status FROM new_rows r JOIN subscribers s ON s.id = r.subscriber_id) x
         GROUP BY 2 ORDER BY 2
        ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + EXCLUDED.n;
    ELSE
        INSERT INTO tallies AS t (subject, key, shard, n)
        SELECT 'members', ARRAY[x.list_id::text, x.status], pg_backend_pid(), -count(*)
          FROM (SELECT r.list_id, s.status FROM old_rows r JOIN subscribers s ON s.id = r.subscriber_id) x
         GROUP BY 2 ORDER BY 2
        ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER tallies_members_inserted AFTER INSERT ON list_members
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_members_changed();
CREATE TRIGGER tallies_members_deleted AFTER DELETE ON list_members
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tallies_members_changed();

-- A row trigger, fired only when the status changes: an import's upsert of known subscribers
-- (which never sets status) costs nothing here.
CREATE FUNCTION tallies_subscriber_status_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM subscribers WHERE id = NEW.id FOR UPDATE;  -- see the header: then read its lists
    INSERT INTO tallies AS t (subject, key, shard, n)
    SELECT 'members', c.key, pg_backend_pid(), sum(c.n)
      FROM (SELECT ARRAY[m.list_id::text, OLD.status] AS key, -1 AS n FROM list_members m WHERE m.subscriber_id = OLD.id
            UNION ALL
            SELECT ARRAY[m.list_id::text, NEW.status], 1 FROM list_members m WHERE m.subscriber_id = NEW.id) c
     GROUP BY 2 ORDER BY 2
    ON CONFLICT (subject, key, shard) DO UPDATE SET n = t.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE TRIGGER tallies_subscriber_status_changed AFTER UPDATE OF status ON subscribers
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION tallies_subscriber_status_changed();

-- What is there now, counted once: the triggers above hold their tables against writers until
-- this migration commits, so nothing is counted twice or missed.
INSERT INTO tallies (subject, key, shard, n)
SELECT 'members', ARRAY[m.list_id::text, s.status], 0, count(*)
  FROM list_members m JOIN subscribers s ON s.id = m.subscriber_id
 GROUP BY 2;
