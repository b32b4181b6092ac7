"""Benchmark: how many of the failed recipients in flufl.bounce's corpus of real bounces
`senddock bounces parse` finds, and how many of its negatives it wrongly calls a bounce.

    python bench/bounce_corpus.py [--corpus DIR] [--json]

The corpus is flufl.bounce's test data (117 messages from real servers, 1998-2012, LGPL): its
source distribution holds the messages (tests/data/) and, in tests/test_detectors.py, which
addresses each one says failed, permanently or as a delay notice. It is not copied into this
repository: without --corpus the sdist is fetched from the package index (`pip download`) into a
temporary directory. The expectations are read from the test file's DETECTORS list with `ast`,
never by importing it.

Counted:
* failed recipients: a message's permanent failures (entries with is_temporary False); found when
  `bounces parse` reports the message as hard or soft and names the address (case-insensitive);
* negatives: the messages with no permanent failure (delay notices, the ones flufl's tests list
  as naming nothing, the ones no test mentions: auto-replies, a person's reply, a bounce naming no
  address), but NOT_NEGATIVES; wrong when `bounces parse` says hard or soft for one.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

FLUFL = "flufl.bounce==6.0.0"
# Listed in flufl's tests with no address only because the test is of a detector that does not read
# its format: a real failure, so no negative. simple_42 is an Exim DSN of Gmail's 5.7.1 spam block.
NOT_NEGATIVES = {"simple_42.txt"}


def fetch_corpus(into: Path) -> Path:
    """flufl.bounce's sdist, unpacked under ``into``: the folder that holds tests/data."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    "-d", str(into), FLUFL], check=True)
    [archive] = into.glob("flufl*bounce-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    [root] = (p for p in into.iterdir() if p.is_dir())
    return root


def expectations(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per file, the addresses that failed permanently and the ones only delayed."""
    tree = ast.parse((root / "tests" / "test_detectors.py").read_text(encoding="utf-8"))
    [entries] = [node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "DETECTORS" for t in node.targets)]
    permanent: dict[str, set[str]] = defaultdict(set)
    temporary: dict[str, set[str]] = defaultdict(set)
    for _detector, name, addresses, is_temporary in ast.literal_eval(entries):
        into = temporary if is_temporary else permanent
        into[name].update(a.decode().lower() for a in addresses)
    return permanent, temporary


def parse_all(files: list[Path]) -> dict[str, dict]:
    """``senddock bounces parse --json`` on every file, as a user runs it."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "senddock.yaml"
        config.write_text("bounces: {secret: \"${BOUNCE_SECRET}\"}\nlogging: {level: error}\n", encoding="utf-8")
        done = subprocess.run([sys.executable, "-m", "senddock", "bounces", "parse", "--json", "-c", str(config),
                               *map(str, files)], capture_output=True, text=True, env={**os.environ, "BOUNCE_SECRET": "corpus-bench-secret"})
    if done.returncode not in (0, 1):
        sys.exit(f"bounces parse failed ({done.returncode}): {done.stderr[-2000:]}")
    # A file that starts with a "From " line is read as an mbox: its messages are FILE#1, FILE#2...
    # (each of these holds one).
    return {Path(line["source"]).name.partition("#")[0]: line for line in map(json.loads, done.stdout.splitlines())}


def measure(root: Path) -> dict:
    data = root / "tests" / "data"
    files = sorted(p for p in data.iterdir() if p.suffix == ".txt")
    permanent, temporary = expectations(root)
    parsed = parse_all(files)
    found = missed = 0
    misses, wrong = [], []
    for path in files:
        line = parsed[path.name]
        bounce = line["kind"] in ("hard", "soft")
        named = {r.lower() for r in line["recipients"]} if bounce else set()
        expected = {a for a in permanent.get(path.name, ()) if a}
        if expected:
            found += len(expected & named)
            missed += len(expected - named)
            if expected - named:
                misses.append({"file": path.name, "missed": sorted(expected - named), "kind": line["kind"],
                               "reason": line["reason"]})
        elif bounce and path.name not in NOT_NEGATIVES:
            wrong.append({"file": path.name, "kind": line["kind"], "recipients": line["recipients"],
                          "delay_notice": bool(temporary.get(path.name))})
    negatives = sum(1 for p in files if not {a for a in permanent.get(p.name, ()) if a} and p.name not in NOT_NEGATIVES)
    return {"messages": len(files), "failed_recipients": found + missed, "found": found,
            "found_share": round(found / (found + missed), 4), "negatives": negatives,
            "negatives_called_bounce": len(wrong), "missed": misses, "wrong": wrong}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, help="an unpacked flufl.bounce sdist (default: downloaded)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = measure(args.corpus or fetch_corpus(Path(folder)))
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['messages']} messages; failed recipients found: {result['found']} of "
          f"{result['failed_recipients']} ({result['found_share']:.1%}); negatives called a bounce: "
          f"{result['negatives_called_bounce']} of {result['negatives']}")
    for miss in result["missed"]:
        print(f"  missed {', '.join(miss['missed'])} in {miss['file']}: {miss['kind']} ({miss['reason']})")
    for item in result["wrong"]:
        print(f"  wrongly {item['kind']}: {item['file']} {item['recipients']}"
              + (" (a delay notice)" if item["delay_notice"] else ""))


if __name__ == "__main__":
    main()
