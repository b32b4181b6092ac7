"""Outgoing webhooks (docs/webhooks.md): events written to an outbox in the transaction of the fact
they report, delivered by every ``senddock run`` node, signed per the Standard Webhooks spec."""
