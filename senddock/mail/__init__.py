"""Building one message: the template engine, the MIME form, the list headers, the DKIM signature,
and the address and header-text checks they rest on. Pure: no database, no network.

Transport plugins use :mod:`senddock.mail.mime` (the bytes of a :class:`senddock.outcome.Message`,
its envelope addresses): every transport sends the same message. The other modules are internal.
"""
