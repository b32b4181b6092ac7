"""Benchmark: render + build + DKIM-sign throughput per core for a typical HTML campaign.

    python bench/render.py [--messages 2000]

No database, no network: one thread does what a worker does per job before the transport is
called (senddock.mail.compose renders the templates and the list headers, senddock.mail.mime builds the
MIME message, senddock.mail.signing signs it with a 2048-bit RSA key), timed on this process's CPU
clock so other load on the machine does not count. The campaign is a ~9 KB newsletter: a
personalised subject, a table of articles, images, links, the unsubscribe link; HTML only, so
the text part is generated as well. Each step is also timed alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import BENCH

from senddock.loading import load_config
from senddock.mail import mime
from senddock.mail.compose import Composer
from senddock.outcome import CampaignContent, Recipient

sys.path.insert(0, str(BENCH.parent / "tests"))
from tests_support import dkim_key  # noqa: E402 - the tests' key maker (cryptography, a test dependency)

ARTICLE = """<tr><td style="padding:12px 0"><img src="https://cdn.example.com/img/{i}.jpg" width="120" alt="">
</td><td style="padding:12px"><h2 style="margin:0;font-size:18px"><a href="https://example.com/a/{i}?u={{{{ subscriber.attributes.uid }}}}">
Article number {i}: what changed this week</a></h2><p style="margin:4px 0;color:#555">A short summary of the article, two
sentences long, so the paragraph wraps like real newsletter copy does. Read on for the details.</p></td></tr>
"""
HTML = ("""<!doctype html><html><head><meta charset="utf-8"><title>{{ campaign.name }}</title></head>
<body style="font-family:Arial,sans-serif;margin:0;padding:0;background:#f4f4f4">
<table width="600" align="center" cellpadding="0" cellspacing="0" style="background:#fff">
<tr><td colspan="2" style="padding:24px"><h1>Hello {{ subscriber.name }},</h1>
<p>Here is what happened in {{ subscriber.attributes.city }} and elsewhere this week.</p></td></tr>
""" + "".join(ARTICLE.format(i=i) for i in range(12)) + """
<tr><td colspan="2" style="padding:24px;font-size:12px;color:#888">You receive this because you subscribed
as {{ subscriber.email }}. <a href="{{ unsubscribe_url }}">Unsubscribe</a>.</td></tr>
</table></body></html>""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        key_file, _ = dkim_key(Path(folder))
        path = Path(folder) / "senddock.yaml"
        path.write_text(yaml.safe_dump({
            "unsubscribe": {"url": "https://lists.example.com", "secret": "${SECRET}"},
            "dkim": {"domain": "example.com", "selector": "s1", "private_key_file": str(key_file)},
        }))
        config = load_config(path, environ={"SECRET": "bench-secret-0123456789", "SENDDOCK_DATABASE_URL": "x"})
        composer = Composer(config)
        content = CampaignContent(campaign_id=1, name="Weekly", subject="{{ subscriber.name }}, your week in review",
                                  from_addr="Weekly News <news@example.com>", html_body=HTML, list_id=1,
                                  list_name="Weekly")
        prepared = composer.prepare(content)
        recipients = [Recipient(f"reader{i}@example.com", f"Reader Nº{i}", {"city": "Zürich", "uid": i}, i)
                      for i in range(args.messages)]
        timings = {"render": 0.0, "build": 0.0, "sign": 0.0}
        size = 0
        started = time.process_time()
        for i, recipient in enumerate(recipients):
            t0 = time.process_time()
            message = composer.message(prepared, recipient, job_id=i + 1, broadcast_id=1, attempt=1)
            t1 = time.process_time()
            data = mime.build_email(message).as_bytes()
            t2 = time.process_time()
            signed = message.signer.sign(data)
            t3 = time.process_time()
            timings["render"] += t1 - t0
            timings["build"] += t2 - t1
            timings["sign"] += t3 - t2
            size += len(signed)
        total = time.process_time() - started
    per_core = args.messages / total
    row = {"messages": args.messages, "messages_per_s_per_core": round(per_core),
           "avg_message_bytes": size // args.messages,
           **{f"{k}_us": round(v / args.messages * 1e6) for k, v in timings.items()}}
    print(f"{per_core:,.0f} messages/s per core ({size // args.messages:,} bytes each): render "
          f"{row['render_us']} us, build {row['build_us']} us, DKIM sign {row['sign_us']} us per message")
    print(json.dumps({"benchmark": "render", **row}))


if __name__ == "__main__":
    main()
