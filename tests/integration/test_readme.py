"""README's walk-through runs as written, top to bottom, as a newcomer on a fresh clone runs it.

Every ```console block of README (but those marked ``<!-- readme-test: skip ... -->``) is one
story: its ``$ `` commands run in order, each in bash, in a fresh folder holding copies of config/
and examples/ only, so the embedded Postgres of the shipped config starts there (never
SENDDOCK_TEST_DSN: the newcomer has no server). The environment and folder a command leaves (an
``export``) carry over to the next, as in a terminal. Output is compared with the rules of
tests/readme_story.py, which README states above its first block.

Two departures from a newcomer's terminal, both needed to run the story here and nothing else:
- ``pip install`` lines are skipped: the test runs in an environment where senddock is installed.
- The sink and the config's smtp.port move from 1025 to a free port (other sinks may be running
  on this machine); the test first checks that README's sink and config agree on 1025.

Every background command (``... &``), and the embedded Postgres, is stopped at the end, pass or fail.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from readme_story import Command, compare, console_blocks
from senddock.cli import build_parser
from senddock.loading import load_config
from senddock.sink import free_port

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SINK_DEFAULT_PORT = 1025
COMMAND_TIMEOUT = 120  # seconds; `campaign status --watch` waits for the campaign to finish


def story_commands() -> list[Command]:
    return [c for block in console_blocks(README.read_text(encoding="utf-8")) if not block.skipped
            for c in block.commands]


def describe(command: Command) -> str:
    return f"README.md:{command.line}: $ {command.text}"


class Story:
    """The folder, shell state and background processes of one run of the walk-through."""

    def __init__(self, folder: Path, smtp_port: int):
        self.folder = folder
        self.smtp_port = smtp_port
        self.state = folder.parent / "shell-state.sh"  # outside the folder: README's commands never see it
        self.state.write_text("", encoding="utf-8")
        self.background: list[tuple[Command, subprocess.Popen, Path]] = []
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("SENDDOCK_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        self.env["PATH"] = path  # `senddock` and `python` of this environment, as in an activated venv

    def script(self, command: Command, text: str) -> str:
        if re.match(r"senddock\s+sink\b", text):
            text = re.sub(r"^senddock\s+sink\b", f"senddock sink --port {self.smtp_port}", text)
        # The state file carries `export`s and `cd`s from one command to the next.
        state = shlex.quote(str(self.state))
        return (f"source {state}\ncd {shlex.quote(str(self.cwd()))}\n{text}\n__readme_status=$?\n"
                f"export -p > {state}\necho \"__readme_cwd=$(printf %q \"$PWD\")\" >> {state}\n"
                "exit $__readme_status\n")

    def cwd(self) -> Path:
        for line in reversed(self.state.read_text(encoding="utf-8").splitlines()):
            if line.startswith("__readme_cwd="):
                return Path(shlex.split(line.split("=", 1)[1])[0])
        return self.folder

    def start(self, command: Command) -> None:
        log = self.folder.parent / f"background-{command.line}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-c", self.script(command, command.foreground_text())],
                                    cwd=self.cwd(), env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.background.append((command, proc, log))

    def run(self, command: Command) -> subprocess.CompletedProcess:
        self.check_background()
        try:
            return subprocess.run(["bash", "-c", self.script(command, command.text)], cwd=self.cwd(), env=self.env,
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{describe(command)}\ndid not finish in {COMMAND_TIMEOUT}s\nstdout so far:\n"
                        f"{exc.stdout or ''}\nstderr so far:\n{exc.stderr or ''}{self.background_logs()}", pytrace=False)

    def check_background(self) -> None:
        for command, proc, log in self.background:
            if proc.poll() is not None:
                pytest.fail(f"{describe(command)}\nthis background command has exited ({proc.returncode}):\n"
                            f"{log.read_text(errors='replace')[-3000:]}", pytrace=False)

    def background_logs(self) -> str:
        return "".join(f"\n--- {describe(c)} (background) output:\n{log.read_text(errors='replace')[-2000:]}"
                       for c, _, log in self.background)

    def stop(self) -> None:
        """Stop the background commands, newest first (the node before the sink), then any Postgres left."""
        for _, proc, _ in reversed(self.background):
            _stop_group(proc)
        pid_file = self.folder / ".senddock" / "pgdata" / "postmaster.pid"
        deadline = time.monotonic() + 10  # the last senddock process to leave stops it by itself
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_file.exists():
            _stop_postmaster(pid_file)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's process group (bash and what it started), SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _stop_postmaster(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):  # fast shutdown, immediate, then gone
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def test_readme_sink_and_shipped_config_agree_on_the_port():
    """The one thing the story test changes (the port) is checked here, as README has it."""
    sink_commands = [c for c in story_commands() if re.match(r"senddock\s+sink\b", c.text)]
    assert sink_commands, "README's walk-through starts `senddock sink`"
    assert all("--port" not in c.text for c in sink_commands), [describe(c) for c in sink_commands]
    config = (REPO / "config" / "senddock.yaml").read_text(encoding="utf-8")
    assert re.findall(r"^\s+port:\s*(\d+)", config, re.M) == [str(SINK_DEFAULT_PORT)]
    # Without --port the sink listens on the config's smtp.port, 1025 when no config says otherwise.
    assert build_parser().parse_args(["sink"]).port is None
    assert load_config(None).section("smtp")["port"] == SINK_DEFAULT_PORT


@pytest.mark.timeout(600)
def test_readme_walkthrough_runs_as_written(tmp_path: Path):
    commands = story_commands()
    assert len(commands) > 10, "README's console blocks were not found"
    folder = tmp_path / "clone"
    folder.mkdir()
    shutil.copytree(REPO / "config", folder / "config")
    shutil.copytree(REPO / "examples", folder / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache"))
    smtp_port = free_port("127.0.0.1")
    config = folder / "config" / "senddock.yaml"
    text, moved = re.subn(rf"^(\s+port:\s*){SINK_DEFAULT_PORT}\b", rf"\g<1>{smtp_port}", config.read_text(), flags=re.M)
    assert moved == 1
    config.write_text(text, encoding="utf-8")

    story = Story(folder, smtp_port)
    try:
        for command in commands:
            if re.match(r"pip\s+install\b", command.text):
                continue  # this environment is installed already (see the module docstring)
            if command.background:
                assert not command.expected, f"{describe(command)}: a background command's output cannot be compared"
                story.start(command)
                continue
            result = story.run(command)
            if result.returncode != 0:
                pytest.fail(f"{describe(command)}\nexited {result.returncode}\nstdout:\n{result.stdout}\n"
                            f"stderr:\n{result.stderr[-3000:]}{story.background_logs()}", pytrace=False)
            if not command.expected:
                continue
            mismatch = compare(command.expected, result.stdout)
            if mismatch is not None:
                where = (f"README.md:{mismatch.readme_line}: expected {mismatch.expected.strip()!r}"
                         if mismatch.readme_line else "expected no more output")
                got = "the output ended" if mismatch.actual is None else repr(mismatch.actual)
                expected_text = "\n".join(t for _, t in command.expected)
                pytest.fail(f"{describe(command)}\n{where}\n     got {got}\n\nREADME shows:\n{expected_text}\n\n"
                            f"the command printed:\n{result.stdout}\nstderr:\n{result.stderr[-2000:]}", pytrace=False)
        story.check_background()
    finally:
        story.stop()
