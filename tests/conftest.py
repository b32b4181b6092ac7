from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from senddock.cli import main
from tests_support import senddock_executable

pytest_plugins = ["senddock.testing"]

REPO = Path(__file__).resolve().parent.parent


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (README's command): two test processes per core. Most of a test's time is
    waiting (on relays, leases, subprocesses, Postgres), so one per core leaves the cores half
    idle; ``SENDDOCK_TEST_WORKERS`` overrides it."""
    if os.environ.get("SENDDOCK_TEST_WORKERS"):
        return int(os.environ["SENDDOCK_TEST_WORKERS"])
    return 2 * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, f"expected exactly one JSON line on stdout, got: {self.stdout!r}"
        return json.loads(lines[0])


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    """A config file with warnings-only logging (test files that need another one define their own)."""
    path = tmp_path / "senddock.yaml"
    path.write_text("logging:\n  level: warning\n", encoding="utf-8")
    return path


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], database_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run the senddock CLI in-process on this test's database: as ``run_senddock`` does, a
    fraction of a second cheaper a command (no interpreter to start, nothing to import again).
    ``env`` adds variables for this command only; ``db=False`` runs it with no database URL."""
    monkeypatch.setenv("SENDDOCK_DATABASE_URL", database_dsn)

    def run(*argv: str, env: dict[str, str] | None = None, db: bool = True) -> CliResult:
        capsys.readouterr()
        try:
            with monkeypatch.context() as scoped:
                for name, value in (env or {}).items():
                    scoped.setenv(name, value)
                if not db:
                    scoped.delenv("SENDDOCK_DATABASE_URL")
                code = main([str(a) for a in argv])
        finally:
            structlog.reset_defaults()  # the CLI configured logging for this process
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture
def in_test_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test runs in its own folder, as a user's shell is in theirs: relative paths given to
    the in-process ``cli`` (and a config's own, like the shipped one's) resolve there, never in
    the checkout. ``run_senddock`` runs its subprocess there already."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def run_senddock(database_dsn: str, tmp_path: Path) -> Callable[..., CliResult]:
    """Run the real ``senddock`` console script in a subprocess on this test's database."""

    def run(*argv: str, env: dict[str, str] | None = None, timeout: float = 120, db: bool = True) -> CliResult:
        full_env = {**os.environ, **(env or {})}
        if db:
            full_env["SENDDOCK_DATABASE_URL"] = database_dsn
        proc = subprocess.run(
            [senddock_executable(), *map(str, argv)],
            capture_output=True, text=True, env=full_env, timeout=timeout, cwd=tmp_path,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run
