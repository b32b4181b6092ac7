"""senddock: a crash-safe mailing pipeline on a Postgres queue.

Plugin authors need :data:`hookimpl`, :class:`Transport` (a base for transport plugins) and the value
types in :mod:`senddock.outcome`; applications use :class:`senddock.api.Senddock`.
"""

from senddock.hooks import hookimpl, hookspec
from senddock.transport import Transport

__version__ = "0.1.0"
__all__ = ["Transport", "__version__", "hookimpl", "hookspec"]
