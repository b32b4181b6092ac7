"""Where the suite's CPU goes, per test file: ``PYTHONPATH=tests pytest -n 0 -p cpu_profile``.

The suite is CPU-bound on a 2-core machine: its wall time is its CPU seconds over the cores, so
the files that cost the most CPU are the ones to make cheaper. Per test it counts the whole
machine's busy CPU (/proc/stat: the test process, the nodes and sinks it starts, Postgres), so run
it alone on the machine and with ``-n 0`` (one test at a time); it also counts the test process's
own CPU and that of the children it waited for. At the end it prints the costliest files and,
with ``SENDDOCK_CPU_PROFILE=FILE``, writes every test's figures as JSON lines.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")
_rows: list[dict] = []


def _machine() -> float:
    with open("/proc/stat", encoding="ascii") as stat:
        fields = stat.readline().split()
    return sum(int(v) for v in (fields[1], fields[2], fields[3], fields[6], fields[7])) / _TICKS


def _children() -> float:
    times = os.times()
    return times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    machine, own, children, wall = _machine(), time.process_time(), _children(), time.monotonic()
    yield
    _rows.append({"test": item.nodeid, "file": item.nodeid.split("::")[0],
                  "machine_cpu": round(_machine() - machine, 2), "own_cpu": round(time.process_time() - own, 2),
                  "children_cpu": round(_children() - children, 2), "wall": round(time.monotonic() - wall, 2)})


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    by_file: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in _rows:
        for key in ("machine_cpu", "own_cpu", "children_cpu", "wall"):
            by_file[row["file"]][key] += row[key]
        by_file[row["file"]]["tests"] += 1
    total = sum(f["machine_cpu"] for f in by_file.values())
    write = terminalreporter.write_line
    write(f"CPU by test file (machine CPU-seconds, {len(_rows)} tests, {total:.0f} s in all):")
    for name, f in sorted(by_file.items(), key=lambda kv: -kv[1]["machine_cpu"])[:25]:
        write(f"  {f['machine_cpu']:7.1f} s {100 * f['machine_cpu'] / total:5.1f}%  own {f['own_cpu']:6.1f}  "
              f"children {f['children_cpu']:6.1f}  wall {f['wall']:6.1f}  {int(f['tests']):4d} tests  {name}")
    if path := os.environ.get("SENDDOCK_CPU_PROFILE"):
        with open(path, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(row) + "\n" for row in _rows)
