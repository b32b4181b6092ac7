"""Transport plugins through a real node on a real Postgres: one written against the raw hooks (as
every plugin was before senddock.Transport) and the same one on the base class behave alike; a
worker_started that raises does not keep another plugin's from running."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from senddock import plugins
from senddock.api import Senddock
from senddock.testing import drain, fast_settings
from tests_support import captured_logs, jobs_by_email, make_broadcast, running_node, suppressed, wait_for

# A transport that writes each recipient into a file (its "coop"), one file handle per sender
# thread: opened at the thread's first send, closed as it stops; "gone..." addresses are refused
# and its classifier calls that a bounce. Written twice, the old way and on the base class.
RAW_HOOKS = '''
from senddock import hookimpl
from senddock.outcome import Classification, Outcome, SendResult

@hookimpl
def transport_names():
    return ["pigeon"]

@hookimpl
def config_schema():
    return {"pigeon": {"type": "object", "additionalProperties": False,
                       "properties": {"coop": {"type": "string"}}}}

@hookimpl
def send_message(message, transport, config, worker_state):
    if transport != "pigeon":
        return None
    coop = worker_state.get("pigeon")
    if coop is None:
        coop = worker_state["pigeon"] = open(config.section("pigeon")["coop"], "a", encoding="utf-8")
        coop.write("opened\\n")
    if message.recipient.email.startswith("gone"):
        return SendResult("pigeon", ok=False, code=550, text="no such pigeon", phase="rcpt")
    coop.write(message.recipient.email + "\\n")
    coop.flush()
    return SendResult("pigeon", ok=True, provider_message_id=message.message_id)

@hookimpl
def classify_result(result):
    if result.transport != "pigeon":
        return None
    if result.ok:
        return Classification(Outcome.SENT, "sent")
    return Classification(Outcome.BOUNCE, "no_such_pigeon", about_recipient=True)

@hookimpl
def worker_stopped(worker_state):
    coop = worker_state.pop("pigeon", None)
    if coop is not None:
        coop.write("closed\\n")
        coop.close()
'''

BASE_CLASS = '''
from pathlib import Path

from senddock import Transport
from senddock.outcome import Classification, Outcome, SendResult

class Pigeon(Transport):
    name = "pigeon"
    schema = {"type": "object", "additionalProperties": False, "properties": {"coop": {"type": "string"}}}

    def open(self, settings):
        coop = Path(settings["coop"]).open("a", encoding="utf-8")
        coop.write("opened\\n")
        return coop

    def send(self, message, settings, coop):
        if message.recipient.email.startswith("gone"):
            return SendResult(self.name, ok=False, code=550, text="no such pigeon", phase="rcpt")
        coop.write(message.recipient.email + "\\n")
        coop.flush()
        return SendResult(self.name, ok=True, provider_message_id=message.message_id)

    def classify(self, result, message):
        if result.ok:
            return Classification(Outcome.SENT, "sent")
        return Classification(Outcome.BOUNCE, "no_such_pigeon", about_recipient=True)

    def close(self, coop):
        coop.write("closed\\n")
        coop.close()

plugin = Pigeon()
'''


@pytest.mark.parametrize("style, source", [("raw_hooks", RAW_HOOKS), ("base_class", BASE_CLASS)])
def test_a_transport_sends_end_to_end_written_on_the_raw_hooks_or_on_the_base_class(
        make_config, tmp_path: Path, monkeypatch, style, source):
    module = f"acme_pigeon_{style}"
    site = tmp_path / "plugin_site"
    site.mkdir()
    (site / f"{module}.py").write_text(source, encoding="utf-8")
    monkeypatch.syspath_prepend(str(site))
    coop = tmp_path / "coop.txt"
    app = Senddock(make_config(fast_settings(transport="pigeon", concurrency=3, plugins={"load": [module]},
                                             pigeon={"coop": str(coop)})))
    assert app.config.transport_providers["pigeon"] == module
    emails = [f"reader{i}@example.com" for i in range(12)] + ["gone@example.com"]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)
    lines = Counter(coop.read_text(encoding="utf-8").splitlines())
    assert {line: n for line, n in lines.items() if "@" in line} == {email: 1 for email in emails[:-1]}
    # Every file a sender thread opened, it closed as it stopped: at most one per sender thread.
    assert 1 <= lines["opened"] == lines["closed"] <= 3
    jobs = jobs_by_email(app, campaign_id)
    assert jobs["gone@example.com"] == ("failed", "bounced", 1)  # its own classifier's verdict
    assert {jobs[email] for email in emails[:-1]} == {("sent", None, 1)}
    assert suppressed(app) == {"gone@example.com": "bounced"}
    assert app.campaign_status(campaign_id).status == "finished"
    app.close()


def test_a_worker_started_that_raises_does_not_skip_another_plugins(make_config, smtp_sink, tmp_path: Path,
                                                                     monkeypatch):
    """A plugin's worker_started that raises, called first (tryfirst): the SMTP transport's, called
    after it, still opens each sender's session as the node starts, and the failure is logged with
    the plugin's name. (pluggy alone stops at the first exception: no session would open ahead.)"""
    site = tmp_path / "plugin_site"
    site.mkdir()
    (site / "acme_buggy_warm_up.py").write_text(
        "from senddock import hookimpl\n\n@hookimpl(tryfirst=True)\ndef worker_started(worker_state):\n"
        "    raise KeyError('bug in the plugin')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(site))
    settings = fast_settings(smtp_sink.port, concurrency=3, plugins={"load": ["acme_buggy_warm_up"]})
    settings["smtp"]["connect_at_start"] = True
    config = make_config(settings)
    with captured_logs(plugins) as logs, running_node(config):
        # Nothing is queued: a session now was opened by worker_started, not by a send.
        wait_for(lambda: len(smtp_sink.handler.sessions()) == 3, 10, "each of the 3 senders to connect ahead")
    failed = [(e["hook"], e["plugin"]) for e in logs if e["event"] == "plugin_failed"]
    assert failed == [("worker_started", "acme_buggy_warm_up")] * 3
    assert smtp_sink.received == []
