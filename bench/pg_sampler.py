"""The process behind common.PgSampler: samples a database's sessions until its stdin closes.

    python bench/pg_sampler.py DSN INTERVAL_SECONDS

Says ``ready`` once its first sample is taken, then samples every INTERVAL; when its stdin closes it
takes a last one and prints what it saw as one JSON object (common.Connections' fields).
"""

from __future__ import annotations

import dataclasses
import json
import select
import sys

from common import Sampling


def main() -> None:
    dsn, interval = sys.argv[1], float(sys.argv[2])
    sampling = Sampling(dsn)
    print("ready", flush=True)
    # stdin readable means closed (the parent never writes): the stop, and the clock between samples.
    while not select.select([sys.stdin], [], [], interval)[0]:
        sampling.sample()
    sampling.close()
    print(json.dumps(dataclasses.asdict(sampling.result)), flush=True)


if __name__ == "__main__":
    main()
