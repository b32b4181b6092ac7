"""Benchmark: how long one `senddock` command takes, from exec to exit, as a user runs it.

    python bench/cli_latency.py [--dsn ADMIN_DSN | --embedded] [--runs 11] [--baseline DIR_OR_PYTHON]

Creates a scratch database (a list of --subscribers, a campaign sent to it, its jobs pending),
then runs each command --runs times as a fresh process (`python -m senddock ... -c FILE`, the
database given by SENDDOCK_DATABASE_URL, output discarded) and prints the median wall time of
each. The first run of each command is a discarded warm-up that also writes the bytecode cache,
as an installed package has one: the cache goes to a temporary PYTHONPYCACHEPREFIX, so the
checkout is not written to and PYTHONDONTWRITEBYTECODE in the environment does not make every
run compile senddock again. `python -c pass` is the floor: the interpreter's own start-up.

--baseline runs the same commands with another senddock, in the same run, alternating with this
one so both see the same load: a directory is a checkout (run with this interpreter, the checkout
and its plugins first on PYTHONPATH; e.g. `git worktree add /tmp/senddock-main main`), a file is
the python of another virtualenv. The ratio is baseline / this. Targets: `--help` under 0.3 s,
`campaign status` under 0.5 s.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import admin_dsn, bench_config, bench_parser, enqueue, fill_list, open_app, scratch_database

from senddock.cli.logs import configure_logging

TARGETS = {"--help": 0.3, "campaign status ID": 0.5}


def commands(campaign_id: int) -> dict[str, list[str]]:
    """Label -> argv after ``python``; ``-c FILE`` is added to those that read the config."""
    return {
        "python -c pass": ["-c", "pass"],
        "--help": ["-m", "senddock", "--help"],
        "--version": ["-m", "senddock", "--version"],
        "check-config": ["-m", "senddock", "check-config"],
        "campaign status ID": ["-m", "senddock", "campaign", "status", str(campaign_id)],
        "campaign ls": ["-m", "senddock", "campaign", "ls"],
        "lists ls": ["-m", "senddock", "lists", "ls"],
    }


class Side:
    """One senddock to time: an interpreter and the environment that selects its code."""

    def __init__(self, name: str, python: str, env: dict[str, str]) -> None:
        self.name, self.python, self.env = name, python, env

    def run(self, argv: list[str], cwd: Path) -> float:
        started = time.perf_counter()
        proc = subprocess.run([self.python, *argv], cwd=cwd, env=self.env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=120)
        elapsed = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"{self.name}: `{' '.join(argv)}` exited with {proc.returncode}:\n"
                             f"{proc.stderr.decode(errors='replace')}")
        return elapsed


def sides(baseline: str | None, dsn: str, folder: Path) -> list[Side]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    env.update(SENDDOCK_DATABASE_URL=dsn, PYTHONPYCACHEPREFIX=str(folder / "pycache"))
    found = [Side("this", sys.executable, env)]
    if baseline is not None:
        path = Path(baseline).resolve()
        if path.is_dir():
            roots = [path, path / "plugins" / "smtp", path / "plugins" / "ses_like"]
            found.append(Side("baseline", sys.executable, {**env, "PYTHONPATH": os.pathsep.join(map(str, roots))}))
        elif path.is_file():
            found.append(Side("baseline", str(path), env))
        else:
            raise SystemExit(f"--baseline {baseline}: neither a checkout nor a python executable")
    return found


def measure(dsn: str, folder: Path, runs: int, subscribers: int, baseline: str | None) -> dict:
    fill_list(dsn, subscribers)
    config = bench_config(dsn, folder, {})
    app = open_app(config, dsn)
    campaign_id, _ = enqueue(app)
    app.close()
    config_file = folder / "senddock.yaml"
    # The commands run in an empty folder: a checkout in the current directory would shadow the code
    # under test, and config/senddock.yaml there would be picked up without -c.
    cwd = folder / "cwd"
    cwd.mkdir()
    timed = sides(baseline, dsn, folder)
    rows = {}
    for label, argv in commands(campaign_id).items():
        if argv[:2] == ["-m", "senddock"] and not argv[2].startswith("--"):
            argv = [*argv, "-c", str(config_file)]
        times: dict[str, list[float]] = {side.name: [] for side in timed}
        for side in timed:
            side.run(argv, cwd)  # warm-up: fills the bytecode cache
        for _ in range(runs):
            for side in timed:  # alternating: a burst of load on the machine hits both sides alike
                times[side.name].append(side.run(argv, cwd))
        row = {name: round(statistics.median(values), 4) for name, values in times.items()}
        if "baseline" in row:
            row["ratio"] = round(row["baseline"] / row["this"], 2)
        rows[label] = row
        print(f"  {label:20s} " + "  ".join(f"{name} {value:6.3f} s" if name != "ratio" else f"{value:5.2f}x"
                                             for name, value in row.items()), flush=True)
    return {"runs": runs, "subscribers": subscribers, "baseline": baseline, "commands": rows,
            "targets_s": TARGETS, "targets_met": all(rows[label]["this"] < limit for label, limit in TARGETS.items())}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=11, help="timed runs of each command (after one warm-up)")
    parser.add_argument("--subscribers", type=int, default=1000, help="recipients of the campaign `campaign status` reads")
    parser.add_argument("--baseline", metavar="DIR_OR_PYTHON", help="another senddock to time in the same run")
    args = parser.parse_args()
    configure_logging("warning", "json")  # this process's own set-up (migrations) stays quiet
    with tempfile.TemporaryDirectory(prefix="senddock-cli-") as folder, scratch_database(admin_dsn(args)) as dsn:
        result = measure(dsn, Path(folder), args.runs, args.subscribers, args.baseline)
    status, help_ = result["commands"]["campaign status ID"], result["commands"]["--help"]
    print(f"median of {args.runs}: --help {help_['this']:.3f} s (target < 0.3 s), campaign status "
          f"{status['this']:.3f} s (target < 0.5 s)"
          + (f"; baseline {help_['baseline']:.3f} s and {status['baseline']:.3f} s" if args.baseline else ""))
    print(json.dumps({"benchmark": "cli_latency", **result}))


if __name__ == "__main__":
    main()
