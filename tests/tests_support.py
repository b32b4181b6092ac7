"""Helpers shared by test modules (conftest holds the fixtures)."""

from __future__ import annotations

import base64
import functools
from contextlib import ExitStack, contextmanager
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import yaml


def dkim_key(folder: Path) -> tuple[Path, str]:
    """An RSA key file in ``folder`` and the DNS TXT record that publishes its public half. One key
    per test process: making a 2048-bit key took 53 ms, most of some tests' time."""
    private, record = _dkim_key_pair()
    path = folder / "dkim.pem"
    path.write_bytes(private)
    return path, record


@functools.cache
def _dkim_key_pair() -> tuple[bytes, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, f"v=DKIM1; k=rsa; p={base64.b64encode(public).decode()}"


def dns_for(record: str, name: str = "s1._domainkey.example.com."):
    """A resolver for dkim.verify that knows one TXT record."""

    def lookup(qname, timeout=5):
        return record.encode() if qname.decode() == name else None

    return lookup


# .ci/run sets it: there, a tool a test needs that is missing fails the test (a skip proves nothing);
# on a developer's machine without Debian's package the test says what it skipped and why.
ENV_REQUIRE_TOOLS = "SENDDOCK_TESTS_REQUIRE_TOOLS"


def require_tool(name: str, package: str, *candidates: str) -> str:
    """The path of the program ``name`` (or of the first of ``candidates`` that exists), or the test
    skipped saying which Debian package brings it (failed where ENV_REQUIRE_TOOLS is set)."""
    import shutil

    import pytest

    found = shutil.which(name) or next((c for c in candidates if Path(c).exists()), None)
    if found:
        return found
    message = f"{name} is not installed: apt-get install {package} (.ci/run does)"
    if os.environ.get(ENV_REQUIRE_TOOLS):
        pytest.fail(message)
    pytest.skip(message)


def installed_transports() -> str:
    """The transports installed here, as config errors list them: ``ses_like, smtp`` and those of
    any third-party plugin installed beside senddock."""
    from senddock.plugins import build_plugin_manager

    return ", ".join(sorted(build_plugin_manager().transports))


def senddock_executable() -> str:
    """The installed console script next to this interpreter."""
    candidate = Path(sys.executable).with_name("senddock")
    return str(candidate) if candidate.exists() else "senddock"


# Runs senddock's main() in a fresh interpreter, then writes the modules it imported (as JSON) to
# the file named by its first argument: the pytest process has imported everything long since.
_IMPORTS_PROBE = """
import json, sys
from senddock.cli import main
out, argv = sys.argv[1], sys.argv[2:]
try:
    code = main(argv)
except SystemExit as exc:  # --help and --version exit from argparse
    code = exc.code
with open(out, "w", encoding="utf-8") as f:
    json.dump(sorted(sys.modules), f)
sys.exit(code)
"""


def imports_of(argv, *, cwd: Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The finished ``senddock ARGV`` and what it imported: the top-level packages (``psycopg``,
    ``jinja2``...) and senddock's own modules by their whole name (``senddock.mail.compose``)."""
    import json

    out = cwd / f"imports-{uuid.uuid4().hex[:8]}.json"
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_PROBE, str(out), *map(str, argv)], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)
    modules = json.loads(out.read_text(encoding="utf-8"))
    return proc, {name.split(".")[0] for name in modules} | {name for name in modules if name.startswith("senddock.")}


def make_broadcast(app, emails, **options) -> int:
    """senddock.testing.send_broadcast (imported late: pytest loads that module as a plugin)."""
    from senddock.testing import send_broadcast

    return send_broadcast(app, emails, **options)


def jobs_by_email(app, campaign_id: int) -> dict[str, tuple]:
    """email -> (status, failure_reason, attempts) of the campaign's jobs."""
    with app.db.connection() as conn:
        rows = conn.execute(
            "SELECT j.email, j.status, j.failure_reason, j.attempts FROM broadcast_jobs j "
            "JOIN campaigns c ON c.broadcast_id = j.broadcast_id WHERE c.id = %s", (campaign_id,)).fetchall()
    return {r[0]: r[1:] for r in rows}


def suppressed(app) -> dict[str, str]:
    with app.db.connection() as conn:
        return dict(conn.execute("SELECT lower(email), reason FROM suppressions").fetchall())


def start_node(config_path: Path, database_dsn: str, node: str | None, *extra: str) -> subprocess.Popen:
    """``senddock run`` as a subprocess; ``node`` None: no --node (the default name)."""
    env = {**os.environ, "SENDDOCK_DATABASE_URL": database_dsn}
    name = ["--node", node] if node is not None else []
    return subprocess.Popen([senddock_executable(), "run", "-c", str(config_path), *name, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def write_config(tmp_path: Path, settings: dict) -> Path:
    path = tmp_path / "senddock.yaml"
    path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    return path


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def still_true(predicate, seconds: float) -> bool:
    """Whether ``predicate`` holds for ``seconds``, looked at every 50 ms; False at once when it
    does not. For "nothing more happens": call it once the state it is about has been waited
    for, over a span the engine's own cadence sets (poll intervals, heartbeats), not a guess."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.05)
    return predicate()


def sent_count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM broadcast_jobs WHERE status = 'sent'").fetchone()[0]


def campaign_status(dsn: str, campaign_id: int) -> str:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT status FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()[0]


def register(conn: psycopg.Connection, name: str, *, heartbeat_age: str = "0 seconds"):
    """A node registered as a lifeline does it: in the server's current epoch."""
    from senddock.core.epoch import ensure_epoch
    from senddock.store.node_identity import NodeIdentity

    ensure_epoch(conn)
    node = NodeIdentity(id=uuid.uuid4(), name=name, host="test", pid=1)
    conn.execute("INSERT INTO nodes (id, name, host, pid, heartbeat_at, settled_epoch) "
                 "VALUES (%s, %s, 'test', 1, now() - %s::interval, (SELECT id FROM server_epoch))",
                 (node.id, name, heartbeat_age))
    return node


@contextmanager
def running_node(config, **options):
    """A Runner in a thread of this test process for the ``with`` block, stopped at its end."""
    import threading

    from senddock.core.runner import Runner

    runner = Runner(config, **options)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        yield runner
    finally:
        runner.request_stop()
        thread.join(30)


def asgi_request(app, method: str, path: str, body: bytes = b"", headers=(),
                 client: str = "127.0.0.1") -> list[dict]:
    """One HTTP request to an ASGI app in-process, from ``client``; the messages it sent back
    (start, then body)."""
    import asyncio

    headers = [(b"content-length", str(len(body)).encode()), *headers]
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": headers, "client": (client, 5000), "server": ("127.0.0.1", 8025),
             "scheme": "http", "root_path": "", "http_version": "1.1"}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def kill_while_sending(config_path: Path, database_dsn: str, node_name: str, *, rounds: int, progress: int,
                       most_pause: float, seed: int, finished=None, after_each=None) -> int:
    """Start a node ``rounds`` times and kill -9 it while it sends: once it has sent ``progress``
    more jobs, after a random pause of up to ``most_pause`` s. ``after_each()`` runs after each
    death; ``finished()`` ends the rounds early. Returns how many kills there were."""
    import random
    import signal

    rng = random.Random(seed)
    kills = 0
    for _ in range(rounds):
        before = sent_count(database_dsn)
        node = start_node(config_path, database_dsn, node_name)
        try:
            wait_for(lambda: sent_count(database_dsn) > before + progress or node.poll() is not None, 60, "progress")
            time.sleep(rng.uniform(0.0, most_pause))
        finally:
            # Killed on a failure too: a node left running outlives its test and its database.
            if node.poll() is None:
                node.send_signal(signal.SIGKILL)
                kills += 1
        node.wait(30)
        if after_each is not None:
            after_each()
        if finished is not None and finished():
            break
    return kills


def duplicates_and_in_doubt(app, sink, emails) -> tuple[set[str], set[str]]:
    """After a broadcast with faults: every recipient got the message at least once (asserted);
    returns who got it twice and who is listed in doubt in the delivery log."""
    from collections import Counter

    delivered = Counter(r.recipients[0] for r in sink.received)
    assert set(delivered) == set(emails), "every recipient got the message at least once"
    with app.db.connection() as conn:
        in_doubt = {r[0] for r in conn.execute(
            "SELECT DISTINCT j.email FROM delivery_attempts a JOIN broadcast_jobs j ON j.id = a.job_id "
            "WHERE a.in_doubt")}
    return {email for email, n in delivered.items() if n > 1}, in_doubt


_DOVECOT_CONF = """\
protocols = imap pop3
listen = 127.0.0.1
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
{users}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {root}/users
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={root}/home/%u
}}
mail_location = maildir:~/Maildir
namespace inbox {{
  inbox = yes
  mailbox Processed {{
    auto = create
  }}
}}
service imap-login {{
  inet_listener imap {{
    port = {imap_port}
  }}
  inet_listener imaps {{
    port = 0
  }}
  chroot =
}}
service pop3-login {{
  inet_listener pop3 {{
    port = {pop3_port}
  }}
  inet_listener pop3s {{
    port = 0
  }}
  chroot =
}}
service anvil {{
  chroot =
}}
"""


class Dovecot:
    """A real IMAP and POP3 server (Debian's dovecot-imapd and dovecot-pop3d, which .ci/run
    installs) with one mailbox, ``USER``/``PASSWORD``, in a folder of its own."""

    USER, PASSWORD = "bounces", "mailbox-password"

    def __init__(self) -> None:
        import pwd
        import tempfile

        from senddock.sink import free_port

        binary = require_tool("dovecot", "dovecot-imapd dovecot-pop3d", "/usr/sbin/dovecot")
        self.root = Path(tempfile.mkdtemp(prefix="senddock-dovecot-"))
        self.root.chmod(0o755)
        (self.root / "home").mkdir(mode=0o777)
        (self.root / "home").chmod(0o777)
        (self.root / "users").write_text(f"{self.USER}:{{PLAIN}}{self.PASSWORD}\n", encoding="utf-8")
        if os.getuid() == 0:  # dovecot will not run a mailbox as root: as nobody, then
            nobody = pwd.getpwnam("nobody")
            uid, gid, users = nobody.pw_uid, nobody.pw_gid, ""
        else:  # not root: everything runs as this user
            me = pwd.getpwuid(os.getuid()).pw_name
            uid, gid = os.getuid(), os.getgid()
            users = f"default_login_user = {me}\ndefault_internal_user = {me}\n"
        self.imap_port, self.pop3_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        (self.root / "dovecot.conf").write_text(_DOVECOT_CONF.format(
            root=self.root, uid=uid, gid=gid, users=users, imap_port=self.imap_port, pop3_port=self.pop3_port))
        self._binary = binary

    def __enter__(self) -> "Dovecot":
        import socket

        subprocess.run([self._binary, "-c", str(self.root / "dovecot.conf")], check=True)

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.imap_port), timeout=0.2).close()
                return True
            except OSError:
                return False
        wait_for(listening, 20, "dovecot")
        return self

    def __exit__(self, *exc: object) -> None:
        import shutil

        # SIGTERM to the master, without waiting the second it takes to see its children out (or
        # the two more of `dovecot stop`): the next test's server has ports and a folder of its own.
        try:
            os.kill(int((self.root / "run" / "master.pid").read_text().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            subprocess.run([self._binary, "-c", str(self.root / "dovecot.conf"), "stop"], check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def imap(self):
        from imap_tools import MailBoxUnencrypted

        return MailBoxUnencrypted("127.0.0.1", self.imap_port).login(self.USER, self.PASSWORD)

    def deliver(self, *messages: bytes) -> None:
        """Put messages in the INBOX, as the MX's delivery would."""
        with self.imap() as box:
            for message in messages:
                box.append(message, "INBOX")

    def count(self, folder: str = "INBOX") -> int:
        with self.imap() as box:
            box.folder.set(folder)
            return len(box.uids())


class PgBouncer:
    """A real PgBouncer (Debian's package, which .ci/run installs) on a port of its own, in front
    of the test's Postgres server (TCP, or the embedded server's socket folder).

    ``mode``: its ``pool_mode``; ``pool_size``: its ``default_pool_size``. :meth:`dsn` gives the
    same database through it. PgBouncer refuses to run as root: as root it is started as the
    ``postgres`` user (or nobody), or as the owner of the embedded server's socket folder.
    """

    def __init__(self, upstream_dsn: str, *, mode: str = "transaction", pool_size: int = 4) -> None:
        import shutil
        import tempfile

        from psycopg.conninfo import conninfo_to_dict

        from senddock.sink import free_port

        self._binary = require_tool("pgbouncer", "pgbouncer", "/usr/sbin/pgbouncer")
        self.upstream = conninfo_to_dict(upstream_dsn)
        self.port = free_port("127.0.0.1")
        self.root = Path(tempfile.mkdtemp(prefix="senddock-pgbouncer-"))
        user = self.upstream.get("user") or "postgres"
        server = " ".join(f"{key}={value}" for key, value in self.upstream.items()
                          if key in ("host", "port", "user", "password") and value)
        (self.root / "users.txt").write_text(f'"{user}" ""\n', encoding="utf-8")
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = {server}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root}/users.txt\n"
            f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
            f"logfile = {self.root}/pgbouncer.log\npidfile = {self.root}/pgbouncer.pid\n"
            # psycopg sends no such parameters, but libpq-based tools may
            "ignore_startup_parameters = extra_float_digits,options\n",
            encoding="utf-8")
        self._as_user: list[str] = []
        if os.getuid() == 0:
            import pwd

            socket_folder = self.upstream.get("host", "")
            if socket_folder.startswith("/"):  # the embedded server's socket: only its owner may connect
                runner = pwd.getpwuid(os.stat(socket_folder).st_uid).pw_name
            else:
                runner = next((name for name in ("postgres", "nobody") if _user_exists(pwd, name)), "nobody")
            shutil.chown(self.root, runner)
            for entry in self.root.iterdir():
                shutil.chown(entry, runner)
            self._as_user = ["-u", runner]

    def dsn(self, dbname: str | None = None) -> str:
        from psycopg.conninfo import make_conninfo

        return make_conninfo("", host="127.0.0.1", port=self.port, user=self.upstream.get("user") or "postgres",
                             dbname=dbname or self.upstream.get("dbname") or "postgres")

    def __enter__(self) -> "PgBouncer":
        subprocess.run([self._binary, "-d", *self._as_user, str(self.root / "pgbouncer.ini")], check=True)

        def answers() -> bool:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                return True
            except psycopg.OperationalError:
                return False
        wait_for(answers, 20, "pgbouncer")
        return self

    def __exit__(self, *exc: object) -> None:
        import shutil
        import signal

        pid_file = self.root / "pgbouncer.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)  # SIGTERM: at once, clients or not
            wait_for(lambda: not pid_file.exists(), 20, "pgbouncer to stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        return (self.root / "pgbouncer.log").read_text(encoding="utf-8", errors="replace")


def _user_exists(pwd, name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@contextmanager
def database_away(database_dsn: str):
    """The test's database refuses every connection and its sessions end, as a failover or a
    restart ends them, for the ``with`` block; it takes connections again afterwards."""
    from psycopg import conninfo

    database = conninfo.conninfo_to_dict(database_dsn)["dbname"]
    with psycopg.connect(conninfo.make_conninfo(database_dsn, dbname="postgres"), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,))
        try:
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')


@contextmanager
def captured_logs(*modules):
    """structlog.testing.capture_logs for what ``modules`` log, whatever ran before: each module's
    ``log`` is swapped for a fresh logger for the block (once the CLI has configured structlog in
    this process, a module's logger is bound and cached, and capture_logs no longer sees it)."""
    from unittest.mock import patch

    import structlog
    from structlog.testing import capture_logs

    with capture_logs() as logs, ExitStack() as stack:
        for module in modules:
            stack.enter_context(patch.object(module, "log", structlog.get_logger(module.__name__)))
        yield logs
