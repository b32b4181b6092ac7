"""Failed logins, counted per client address and per user name: past the limit within the window,
the login form refuses without checking the password until the window has passed.

An attempt is counted as a failure *before* its password is checked (:meth:`LoginThrottle.reserve`)
and taken back only if it succeeds: counted after the check, 40 wrong passwords sent at once were
all checked against a limit of 5. And only so many checks run at once (:class:`Verifications`):
each is argon2 with 64 MiB, and 40 concurrent logins took `serve` from 75 MiB to 2.5 GiB."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable


class LoginThrottle:
    def __init__(self, *, per_client: int = 5, per_user: int = 20, window: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # Per user name more than per client: one address guessing is stopped first, and a
        # spread-out guess still hits a ceiling (the one account is what everyone would guess at).
        self._limits = {"client": per_client, "user": per_user}
        self._window = window
        self._clock = clock
        self._failures: dict[tuple[str, str], deque[float]] = {}
        self._lock = threading.Lock()

    def reserve(self, client: str, user: str) -> tuple[float, float]:
        """Before a password is checked: (0, the attempt's mark) when it may be, counted as a
        failure already; else (seconds until one may be, 0). In one step under the lock, so
        attempts arriving at once are counted one by one against the limit."""
        now = self._clock()
        with self._lock:
            longest = 0.0
            for key in (("client", client), ("user", user)):
                times = self._recent(key, now)
                if len(times) >= self._limits[key[0]]:
                    longest = max(longest, times[0] + self._window - now)
            if longest > 0:
                return longest, 0.0
            for key in (("client", client), ("user", user)):
                self._recent(key, now).append(now)
            return 0.0, now

    def succeeded(self, client: str, user: str, mark: float) -> None:
        """The attempt reserved at ``mark`` was right: it is no failure, and the client's earlier
        ones are forgiven."""
        with self._lock:
            self._failures.pop(("client", client), None)
            times = self._failures.get(("user", user))
            if times is not None and mark in times:
                times.remove(mark)

    def _recent(self, key: tuple[str, str], now: float) -> deque[float]:
        times = self._failures.setdefault(key, deque())
        while times and times[0] <= now - self._window:
            times.popleft()
        if len(self._failures) > 10_000:  # many addresses, each with old failures: forget the idle ones
            self._failures = {k: v for k, v in self._failures.items() if v and v[-1] > now - self._window}
            self._failures.setdefault(key, times)
        return times


class Verifications:
    """At most ``limit`` password checks at once: one more is turned away at once (try again in a
    moment), never queued. Bounds the memory argon2 takes whatever arrives."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    def try_start(self) -> bool:
        return self._slots.acquire(blocking=False)

    def done(self) -> None:
        self._slots.release()
