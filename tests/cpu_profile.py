"""Where the suite's CPU goes, per test file: ``PYTHONPATH=tests pytest -p cpu_profile``.

The suite is CPU-bound on a 2-core machine: its wall time is its CPU seconds over the cores, so
the files that cost the most CPU are the ones to make cheaper. Per test it counts the test
process's own CPU and that of the children it waited for (nodes, sinks, `senddock` commands), and
the whole machine's busy CPU (/proc/stat, Postgres included), which means something only with
``-n 0`` on an otherwise idle machine. With ``SENDDOCK_CPU_PROFILE=FILE`` every process (each
xdist worker) appends its tests' figures to FILE as JSON lines; ``python tests/cpu_profile.py
FILE`` prints the costliest files from them. Without xdist the summary is printed at the end.
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


def pytest_sessionfinish(session):
    if (path := os.environ.get("SENDDOCK_CPU_PROFILE")) and _rows:
        with open(path, "a", encoding="utf-8") as out:  # one write per process: lines stay whole
            out.write("".join(json.dumps(row) + "\n" for row in _rows))


def pytest_terminal_summary(terminalreporter):
    if _rows:
        for line in summary(_rows):
            terminalreporter.write_line(line)


def summary(rows: list[dict]) -> list[str]:
    by_file: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        for key in ("machine_cpu", "own_cpu", "children_cpu", "wall"):
            by_file[row["file"]][key] += row[key]
        by_file[row["file"]]["tests"] += 1
    for f in by_file.values():
        f["cpu"] = f["own_cpu"] + f["children_cpu"]
    total = sum(f["cpu"] for f in by_file.values())
    lines = [f"CPU by test file (own + children CPU-seconds; {len(rows)} tests, {total:.0f} s in all; machine "
             f"CPU {sum(f['machine_cpu'] for f in by_file.values()):.0f} s, meaningful with -n 0 alone):"]
    for name, f in sorted(by_file.items(), key=lambda kv: -kv[1]["cpu"])[:25]:
        lines.append(f"  {f['cpu']:7.1f} s {100 * f['cpu'] / total:5.1f}%  own {f['own_cpu']:6.1f}  children "
                     f"{f['children_cpu']:6.1f}  machine {f['machine_cpu']:6.1f}  wall {f['wall']:6.1f}  "
                     f"{int(f['tests']):4d} tests  {name}")
    return lines


if __name__ == "__main__":
    import sys

    with open(sys.argv[1], encoding="utf-8") as lines:
        print("\n".join(summary([json.loads(line) for line in lines])))
