-- senddock schema, version 16: a message that came back and cannot be applied is counted, once.
--
-- A Final-Recipient holding a NUL made the whole intake fail on it (a DataError), answered 451 at
-- the receiver, so the sending server retried it for days. Texts from messages are cleaned now
-- (senddock.bounces.parsing.storable); what still cannot be applied is recorded as 'unreadable',
-- by its key and size, and not tried again.
ALTER TABLE inbound_mail DROP CONSTRAINT inbound_mail_outcome_check,
    ADD CONSTRAINT inbound_mail_outcome_check CHECK (outcome IN ('applied', 'ignored', 'forged', 'unattributed',
        'unknown_job', 'address_mismatch', 'too_large', 'unreadable'));
