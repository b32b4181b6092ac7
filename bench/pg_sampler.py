"""The process behind common.PgSampler: samples a database's sessions until its stdin closes.

    SENDDOCK_SAMPLER_DSN=DSN python bench/pg_sampler.py INTERVAL_SECONDS

Says ``ready`` once its first sample is taken, then samples every INTERVAL; when its stdin closes it
takes a last one and prints what it saw as one JSON object (common.Connections' fields).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import sys

from common import Sampling


def main() -> None:
    sampling = Sampling(os.environ["SENDDOCK_SAMPLER_DSN"])
    interval = float(sys.argv[1])
    print("ready", flush=True)
    # stdin readable means closed (the parent never writes): the stop, and the clock between samples.
    while not select.select([sys.stdin], [], [], interval)[0]:
        sampling.sample()
    sampling.close()
    print(json.dumps(dataclasses.asdict(sampling.result)), flush=True)


if __name__ == "__main__":
    main()
