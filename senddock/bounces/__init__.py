"""What comes back by mail: bounces, complaints and replies, read, matched to their job by its
signed token, and applied (docs/bounces.md).

``parsing`` turns a message into a report (the ``parse_bounce_message`` hook, whose built-in
implementation is ``builtin``); ``matching`` finds the job from senddock's own token; ``sources``
reads .eml files, Maildir folders and mbox files.
"""
