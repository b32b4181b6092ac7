"""A running `senddock serve` with the dashboard on, and a small HTTP client that keeps its cookie
(the dashboard's tests: plain HTTP in test_dashboard.py, a browser in test_dashboard_browser.py)."""

from __future__ import annotations

import functools
import http.client
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from senddock.sink import free_port
from tests_support import senddock_executable, wait_for

USER = "admin"
PASSWORD = "a long operator password"
HASH_ENV = "SENDDOCK_ADMIN_PASSWORD_HASH"


@functools.cache
def password_hash() -> str:
    from senddock.passwords import hash_password

    return hash_password(PASSWORD)


def admin_settings() -> dict[str, Any]:
    return {"username": USER, "password_hash": "${%s}" % HASH_ENV}


@dataclass
class Served:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def logged(self, event: str, count: int = 1) -> str:
        """The log once it holds ``count`` lines of ``event`` (JSON lines are flushed every 200 ms)."""
        needle = f'"event": "{event}"'
        wait_for(lambda: self.log().count(needle) >= count, 10, f"{count} x {event} in serve's log")
        log = self.log()
        assert log.count(needle) == count, f"{log.count(needle)} x {event}, expected {count}"
        return log


@contextmanager
def serving(settings: dict[str, Any], database_dsn: str, tmp_path: Path, *, admin: bool = True) -> Iterator[Served]:
    """`senddock serve` with ``settings`` (a config dict; serve.admin added when ``admin``), until the block ends."""
    import yaml

    port = free_port("127.0.0.1")
    serve = {**settings.get("serve", {}), "port": port, **({"admin": admin_settings()} if admin else {})}
    config = tmp_path / f"serve-{port}.yaml"
    config.write_text(yaml.safe_dump({**settings, "serve": serve, "logging": {"level": "info", "format": "json"}}),
                      encoding="utf-8")
    log_path = tmp_path / f"serve-{port}.log"
    env = {**os.environ, "SENDDOCK_DATABASE_URL": database_dsn, HASH_ENV: password_hash()}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([senddock_executable(), "serve", "-c", str(config)], env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
    served = Served(process, port, log_path)
    try:
        def answers() -> bool:
            assert process.poll() is None, served.log()
            try:
                return Client(served.url).get("/healthz").status == 200
            except OSError:
                return False

        wait_for(answers, 30, "senddock serve")
        yield served
    finally:
        process.terminate()
        process.wait(30)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str


@dataclass
class Client:
    """HTTP/1.1 with one cookie jar, no redirects followed (the tests look at them)."""

    base: str
    cookies: dict[str, str] = field(default_factory=dict)
    set_cookies: list[str] = field(default_factory=list)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
        host, port = self.base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            answer = Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                            response.read().decode("utf-8", errors="replace"))
            for line in response.headers.get_all("set-cookie") or []:
                self.set_cookies.append(line)
                for name, morsel in SimpleCookie(line).items():
                    if morsel["max-age"] == "0" or not morsel.value.strip('"'):
                        self.cookies.pop(name, None)
                    else:
                        self.cookies[name] = morsel.value
            return answer
        finally:
            conn.close()

    def get(self, path: str) -> Answer:
        return self.request("GET", path)

    def post(self, path: str, fields: dict[str, str], headers: dict[str, str] | None = None) -> Answer:
        return self.request("POST", path, urlencode(fields).encode(),
                            {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})})

    def login(self, password: str = PASSWORD, user: str = USER) -> Answer:
        token = csrf_of(self.get("/dashboard/login").body)
        return self.post("/dashboard/login", {"csrf_token": token, "username": user, "password": password})


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)
