"""Failed logins, counted per client address and per user name: past the limit within the window,
the login form refuses without checking the password until the window has passed."""

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

    def wait(self, client: str, user: str) -> float:
        """Seconds until a login may be tried again (0: now)."""
        now = self._clock()
        longest = 0.0
        with self._lock:
            for key in (("client", client), ("user", user)):
                times = self._recent(key, now)
                if len(times) >= self._limits[key[0]]:
                    longest = max(longest, times[0] + self._window - now)
        return longest

    def failed(self, client: str, user: str) -> None:
        now = self._clock()
        with self._lock:
            for key in (("client", client), ("user", user)):
                self._recent(key, now).append(now)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(("client", client), None)

    def _recent(self, key: tuple[str, str], now: float) -> deque[float]:
        times = self._failures.setdefault(key, deque())
        while times and times[0] <= now - self._window:
            times.popleft()
        if len(self._failures) > 10_000:  # many addresses, each with old failures: forget the idle ones
            self._failures = {k: v for k, v in self._failures.items() if v and v[-1] > now - self._window}
            self._failures.setdefault(key, times)
        return times
