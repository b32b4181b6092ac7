"""Benchmark: `senddock run` draining a broadcast over SMTP, against a bare smtplib loop, in one run.

    python bench/smtp_drain.py [--dsn ADMIN_DSN | --embedded] [--messages 20000] [--workers 5]

Both sides deliver the same number of small messages to a local SMTP sink (senddock.sink.Sink, an
aiosmtpd server in this process) over one reused connection per worker thread. The bare side is
what a script with no queue would do: build an EmailMessage and sendmail() it, nothing durable.
senddock adds everything the queue costs: claims, one commit per message, MIME rendering from the
campaign, plugin calls, classification and logging. Sides alternate; the best of two is kept, and
the sink must have received every message on every run. The sink is slow (aiosmtpd parses every
message) and runs in this process, so both rates are partly bounded by it: the busy CPU of the
whole machine per message is printed beside each rate to show the cost a rate may hide.
"""

from __future__ import annotations

import json
import os
import smtplib
import sys
import tempfile
import threading
import time
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path

from common import (
    admin_dsn,
    bench_config,
    bench_parser,
    enqueue,
    fill_list,
    machine_cpu,
    open_app,
    reset_jobs,
    scratch_database,
)

from render import HTML as NEWSLETTER

from senddock.cli.logs import configure_logging
from senddock.core.runner import Runner
from senddock.sink import Sink


def bare_message(index: int, i: int) -> tuple[str, bytes]:
    """The bare side's message ``i`` of thread ``index``: (recipient, bytes), with senddock's headers
    and a similar size."""
    msg = EmailMessage()
    msg["From"] = "Bench <bench@example.com>"
    msg["To"] = f"user{index}_{i}@example{i % 50}.com"
    msg["Subject"] = "Hi"
    msg["Message-ID"] = make_msgid(domain="example.com")
    msg["Date"] = formatdate(localtime=False, usegmt=True)
    msg.set_content("Hello")
    return msg["To"], msg.as_bytes()


def shares(messages: int, workers: int) -> list[int]:
    share, extra = divmod(messages, workers)
    return [share + (i < extra) for i in range(workers)]


def prebuild(messages: int, workers: int) -> list[list[tuple[str, bytes]]]:
    """Every thread's messages, built before the clock starts (bench/inflight.py's pure send loop)."""
    return [[bare_message(index, i) for i in range(count)] for index, count in enumerate(shares(messages, workers))]


def bare_loop(port: int, messages: int, workers: int, prebuilt: list[list[tuple[str, bytes]]] | None = None) -> None:
    """``workers`` threads, one SMTP connection each for the whole run (as senddock's SMTP transport
    keeps one per worker), sharing ``messages``. Each message is built in the loop, as senddock
    renders one per job, unless ``prebuilt`` (from prebuild()) gives them: then the loop only sends."""

    def work(index: int, count: int) -> None:
        with smtplib.SMTP("127.0.0.1", port, timeout=30) as conn:
            conn.ehlo()
            for i in range(count):
                to, data = prebuilt[index][i] if prebuilt is not None else bare_message(index, i)
                conn.sendmail("bench@example.com", [to], data)

    threads = [threading.Thread(target=work, args=(i, count)) for i, count in enumerate(shares(messages, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def newsletter_settings(folder: Path) -> dict:
    """DKIM and unsubscribe links on, as bench/render.py's newsletter needs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tests_support import dkim_key

    key_file, _ = dkim_key(folder)
    os.environ["BENCH_UNSUBSCRIBE_SECRET"] = "bench-secret-0123456789"
    return {"dkim": {"domain": "example.com", "selector": "s1", "private_key_file": str(key_file)},
            "unsubscribe": {"url": "https://lists.example.com", "secret": "${BENCH_UNSUBSCRIBE_SECRET}"}}


def measure(dsn: str, messages: int, workers: int, folder: Path, newsletter: bool = False) -> dict:
    fill_list(dsn, messages)
    rates: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for side in ("bare", "senddock", "bare", "senddock"):  # alternate, keep the best of two
        with Sink("127.0.0.1", 0) as sink:  # a fresh sink: its received list counts only this run
            if side == "bare":
                started, machine = time.perf_counter(), machine_cpu()
                bare_loop(sink.port, messages, workers)
                seconds = time.perf_counter() - started
                machine_us = (machine_cpu() - machine) / messages * 1e6
            else:
                reset_jobs(dsn)
                config = bench_config(dsn, folder, {
                    "transport": "smtp", "smtp": {"host": "127.0.0.1", "port": sink.port, "security": "none"},
                    "workers": workers, "poll_interval": "100ms", **(newsletter_settings(folder) if newsletter else {})})
                app = open_app(config, dsn)
                # Outside the timing, like the bare side's fill.
                campaign_id, _ = (enqueue(app, html=NEWSLETTER, subject="{{ subscriber.name }}, your week")
                                  if newsletter else enqueue(app))
                started, machine = time.perf_counter(), machine_cpu()
                Runner(config, exit_when_idle=True).run()
                seconds = time.perf_counter() - started
                machine_us = (machine_cpu() - machine) / messages * 1e6
                sent = app.campaign_status(campaign_id).sent
                app.close()
                assert sent == messages, f"senddock marked {sent} of {messages} sent"
            received = len(sink.received)
        assert received == messages, f"{side}: the sink received {received} of {messages} messages"
        rate = messages / seconds
        rates[side] = max(rates.get(side, 0.0), rate)
        cpu[side] = min(cpu.get(side, float("inf")), machine_us)
        # The sink shares this machine (and this process's GIL): when it is the bottleneck both rates
        # approach its speed, so CPU per message on the whole machine shows the cost the rate may hide.
        print(f"  {side:>8}: {messages:,} messages in {seconds:.1f}s = {rate:,.0f} messages/s "
              f"(sink received {received:,}; machine CPU {machine_us:,.0f} us/message)", flush=True)
    return {"messages": messages, "workers": workers,
            "bare_messages_per_s": round(rates["bare"]), "senddock_messages_per_s": round(rates["senddock"]),
            "ratio": round(rates["senddock"] / rates["bare"], 2), "target_ratio": 0.5,
            "bare_machine_cpu_us_per_message": round(cpu["bare"]),
            "senddock_machine_cpu_us_per_message": round(cpu["senddock"])}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--newsletter", action="store_true",
                        help="senddock sends bench/render.py's 23 KB personalised HTML newsletter, DKIM-signed, "
                             "with unsubscribe links (the bare side still sends its small message)")
    parser.add_argument("--log", choices=["info", "warning"], default="info",
                        help="senddock's log level; info (the default of `senddock run`) writes one JSON line "
                             "per attempt, here to stderr")
    args = parser.parse_args()
    # As `senddock run` does when its stderr is not a terminal: buffered JSON lines.
    configure_logging(args.log, "json")
    with tempfile.TemporaryDirectory() as folder, scratch_database(admin_dsn(args)) as dsn:
        row = measure(dsn, args.messages, args.workers, Path(folder), args.newsletter)
    print(f"senddock {row['senddock_messages_per_s']:,} messages/s vs bare smtplib "
          f"{row['bare_messages_per_s']:,} messages/s: ratio {row['ratio']}x (target >= 0.5)")
    print(json.dumps({"benchmark": "smtp_drain", **row}))


if __name__ == "__main__":
    main()
