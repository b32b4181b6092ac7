"""Real-format samples (tests/bounce_samples/, see its README): Postfix, Exim, Sendmail, Exchange
and Office 365, Gmail, Yahoo, qmail, Courier DSNs and NDRs, ARF complaints, auto-replies and
replies, each read by `senddock bounces parse` as expected.json says: kind, recipients, status
and the job its signed token names (or none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog

from senddock.cli import main

SAMPLES = Path(__file__).resolve().parents[1] / "bounce_samples"
EXPECTED = json.loads((SAMPLES / "expected.json").read_text(encoding="utf-8"))
SECRET = "bounce-samples-secret-0123"  # what the samples' tokens were signed with (their README)


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict[str, dict]:
    """Every sample through one `bounces parse --json` run, by file name."""
    import contextlib
    import io
    import os

    config = tmp_path_factory.mktemp("config") / "senddock.yaml"
    config.write_text('bounces: {secret: "%s"}\nlogging: {level: error}\n' % "${BOUNCE_SECRET}", encoding="utf-8")
    os.environ["BOUNCE_SECRET"] = SECRET
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = main(["bounces", "parse", *sorted(str(p) for p in SAMPLES.glob("*.eml")), "-c", str(config), "--json"])
    finally:
        structlog.reset_defaults()
        del os.environ["BOUNCE_SECRET"]
    assert code == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return {Path(line["source"]).name: line for line in lines}


def test_every_sample_has_its_expectation():
    assert sorted(p.name for p in SAMPLES.glob("*.eml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample(parsed, name):
    expected, got = EXPECTED[name], parsed[name]
    assert set(got) == {"source", "kind", "recipients", "status", "reason", "job"}
    assert (got["kind"], got["recipients"], got["status"], got["job"]) == (
        expected["kind"], expected["recipients"], expected["status"], expected["job"]), expected["note"]
