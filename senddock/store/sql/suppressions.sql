-- The suppression list. Parameters are always bound (%(name)s).

-- name: suppression_add
-- A suppression keeps its strongest reason: a complaint, an unsubscribe or an operator's word
-- replaces a bounce (which `campaign unsuppress` may undo), never the other way round.
INSERT INTO suppressions (email, reason, code, diagnostic, source_broadcast_id)
VALUES (%(email)s, %(reason)s, %(code)s, %(diagnostic)s, %(broadcast_id)s)
ON CONFLICT ((lower(email))) DO UPDATE
   SET reason = EXCLUDED.reason, code = EXCLUDED.code, diagnostic = EXCLUDED.diagnostic,
       source_broadcast_id = EXCLUDED.source_broadcast_id
 WHERE suppressions.reason = 'bounced' AND EXCLUDED.reason <> 'bounced'
RETURNING xmax = 0 AS inserted;

-- name: suppression_list
SELECT email, reason, code, diagnostic, source_broadcast_id, created_at
  FROM suppressions
 WHERE (%(reason)s::text IS NULL OR reason = %(reason)s)
   AND (%(search)s::text IS NULL OR email ILIKE '%%' || %(search)s || '%%')
 ORDER BY created_at, id;

-- name: suppression_remove
-- Only future campaigns are affected: nothing already failed as suppressed is sent again.
DELETE FROM suppressions WHERE lower(email) = lower(%(email)s) RETURNING email;
