"""structlog set-up: only the CLI configures logging (console on a terminal, JSON lines otherwise)."""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
FLUSH_INTERVAL = 0.2  # seconds a JSON log line may wait in the buffer
# Lines that may wait while stderr takes none (about 25 MB of JSON lines); more are dropped and counted.
MAX_BUFFERED = 100_000
# While the database cannot be reached, one line per this many seconds says so (see _StdlibBridge).
UNREACHABLE_EVERY = 10.0


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Logs go to stderr, so stdout carries only command results.

    On a terminal each line is written at once. JSON lines (for machines) are buffered and flushed
    every 200 ms: writing and flushing one line per send from a node's threads costs more
    than the send's own database work. A kill -9 can lose the last fraction of a second of log
    lines; the delivery log in the database (delivery_attempts) loses nothing.
    """
    import structlog  # (and rich, which it loads) not before a command runs: `--help` goes without

    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer = structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    sink = _CurrentStderr() if use_console else _BufferedStderr.shared()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=lambda *args: _LineLogger(sink),
        cache_logger_on_first_use=True,  # binding a lazy logger on every call shows up in the send loop
    )
    _bridge_stdlib_logging(_LEVELS[level])


class _StdlibBridge(logging.Handler):
    """Libraries' standard-library log records (psycopg_pool's "discarding closed connection"
    during a Postgres restart...) rendered as senddock's own lines, so JSON stderr stays one JSON
    object per line exactly when an incident makes people read it. Passwords are masked.

    psycopg_pool says "error connecting" at every attempt to reconnect, in many lines (one per host
    of a multi-host DSN): about 10 a second per node while Postgres is down. They become one
    ``database_unreachable`` line at the first failure and then one per UNREACHABLE_EVERY, with
    the attempts counted since the last and the first line of the last error.
    """

    def __init__(self) -> None:
        super().__init__()
        self._unreachable_lock = threading.Lock()
        self._failed_attempts = 0
        self._unreachable_said_at = float("-inf")

    def emit(self, record: logging.LogRecord) -> None:
        import structlog

        from senddock.redact import redact_dsn

        try:
            message = record.getMessage()
            if record.name.startswith("psycopg.pool") and message.startswith("error connecting"):
                self._unreachable(redact_dsn(message.splitlines()[0]), record.name)
                return
            logger = structlog.get_logger(record.name)
            method = getattr(logger, record.levelname.lower(), logger.warning)
            method(redact_dsn(message), logger=record.name)
        except Exception:  # noqa: BLE001 - logging must never raise into the library
            self.handleError(record)

    def _unreachable(self, error: str, name: str) -> None:
        import structlog

        now = time.monotonic()
        with self._unreachable_lock:
            self._failed_attempts += 1
            if now - self._unreachable_said_at < UNREACHABLE_EVERY:
                return
            attempts, self._failed_attempts = self._failed_attempts, 0
            self._unreachable_said_at = now
        structlog.get_logger(name).warning("database_unreachable", attempts=attempts, error=error,
                                           next_line_within_s=UNREACHABLE_EVERY, logger=name)


def _bridge_stdlib_logging(level: int) -> None:
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if not isinstance(h, _StdlibBridge)] + [_StdlibBridge()]
    # Libraries' info lines are their own business; warnings and errors are the operator's.
    root.setLevel(max(level, logging.WARNING))


class _LineLogger:
    """The minimal logger structlog needs: one rendered line per call."""

    def __init__(self, sink) -> None:
        self._sink = sink

    def msg(self, message: str) -> None:
        self._sink.write_line(message)

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


class _CurrentStderr:
    """sys.stderr as it is at each write, so a replaced stream (tests, daemons) is honoured."""

    def write_line(self, line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def flush(self) -> None:
        sys.stderr.flush()


class _BufferedStderr(_CurrentStderr):
    """Lines collected under a lock and written to sys.stderr by a flusher thread and at exit.

    A line is only ever appended under the lock, never written: a stderr that stops taking lines
    (a full pipe nobody reads, a stalled log shipper) blocks the flusher alone, not every thread
    that logs. Written under the lock, a full pipe stopped any thread at its next line for good: a
    node restarted after a kill -9 logs its recovered jobs at once (77-84 KB at concurrency 200,
    more than a pipe holds). At most MAX_BUFFERED lines wait; beyond that a line is dropped and
    counted, and the count is logged once the writes go through again.
    """

    _instance: _BufferedStderr | None = None

    @classmethod
    def shared(cls) -> _BufferedStderr:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._dropped = 0
        self._lock = threading.Lock()  # the lines: held to append or take them, never to write
        self._writing = threading.Lock()  # one flush at a time (the thread's, the exit's): lines keep their order
        threading.Thread(target=self._flush_forever, name="senddock-log-flush", daemon=True).start()
        atexit.register(self.flush)

    def write_line(self, line: str) -> None:
        with self._lock:
            if len(self._lines) < MAX_BUFFERED:
                self._lines.append(line)
            else:
                self._dropped += 1

    def flush(self) -> None:
        with self._writing:
            with self._lock:
                lines, self._lines = self._lines, []
                dropped, self._dropped = self._dropped, 0
            if not lines:
                return
            try:
                sys.stderr.write("\n".join(lines) + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                return  # stderr closed (a daemon, the end of a test): nothing left to tell
        if dropped:
            import structlog

            structlog.get_logger(__name__).error("log_lines_dropped", lines=dropped, waiting_at_most=MAX_BUFFERED,
                                                 reason="stderr took no lines meanwhile")

    def _flush_forever(self) -> None:
        event = threading.Event()
        while True:
            event.wait(FLUSH_INTERVAL)
            self.flush()


def flush_logs() -> None:
    """Write out buffered log lines now (the end of a command)."""
    if _BufferedStderr._instance is not None:
        _BufferedStderr._instance.flush()
