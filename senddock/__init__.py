"""senddock: a crash-safe mailing pipeline on a Postgres queue.

Plugin authors need :data:`hookimpl` and the value types in :mod:`senddock.outcome`; applications use
:class:`senddock.api.Senddock`.
"""

from senddock.hooks import hookimpl, hookspec

__version__ = "0.1.0"
__all__ = ["hookimpl", "hookspec", "__version__"]
