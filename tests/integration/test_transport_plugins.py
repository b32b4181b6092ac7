"""Transport plugins through a real node on a real Postgres: a worker_started that raises does not
keep another plugin's from running."""

from __future__ import annotations

from pathlib import Path

from senddock import plugins
from senddock.testing import fast_settings
from tests_support import captured_logs, running_node, wait_for


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
