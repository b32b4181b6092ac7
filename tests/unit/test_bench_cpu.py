"""The CPU counters of bench/common.py, read from /proc (no psutil): what issue 14's CPU-per-job
figures rest on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from common import machine_cpu, process_cpu  # noqa: E402


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_process_and_machine_cpu_count_a_busy_loop():
    mine, machine = process_cpu(os.getpid()), machine_cpu()
    _spin(0.3)
    # Ticks are 10 ms: allow two of them either way. The machine did at least what this process did.
    assert 0.28 <= process_cpu(os.getpid()) - mine <= 0.6
    assert machine_cpu() - machine >= 0.28


def test_process_cpu_reads_a_command_name_with_spaces_and_parentheses():
    # The name sits in parentheses in /proc/PID/stat: a naive split would shift every field after it.
    child = subprocess.Popen([sys.executable, "-c", (
        "import time, sys\n"
        "open('/proc/self/comm', 'w').write('a) b (c 1 2')\n"
        "end = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\n"
        "print('spun', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "spun\n"
        assert Path(f"/proc/{child.pid}/comm").read_text().strip() == "a) b (c 1 2"
        assert 0.28 <= process_cpu(child.pid) <= 2.0
    finally:
        child.stdin.close()
        child.wait(10)
    assert process_cpu(child.pid) is None  # reaped: gone, not zero
