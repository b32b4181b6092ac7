"""Write a CSV of N made-up readers to stdout: `python examples/readers.py 2000 > readers.csv`.

The walk-through's second campaign needs enough readers to pause it mid-flight; every address is
at example.com (RFC 2606: it never receives mail) and goes to `senddock sink` anyway.
"""

from __future__ import annotations

import csv
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python examples/readers.py N > readers.csv", file=sys.stderr)
        return 2
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["email", "name", "city"])
    cities = ["London", "Paris", "São Paulo", "Kraków", ""]
    for n in range(1, int(argv[0]) + 1):
        writer.writerow([f"reader{n}@example.com", f"Reader {n}", cities[n % len(cities)]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
