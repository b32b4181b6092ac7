"""senddock.Transport: the hooks it implements for a subclass, and how a plugin module holding one
is registered. End to end (a node sending through one) in tests/integration/test_transport_plugins.py."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from senddock import Transport, hookimpl
from senddock.core import results
from senddock.outcome import Classification, Outcome, SendResult
from senddock.plugins import build_plugin_manager, call_each, describe
from tests_support import captured_logs


class Settings:
    """The two things a hook reads of the configuration (senddock.outcome.PluginConfig)."""

    def __init__(self, transport: str, sections: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.transport = transport
        self._sections = sections or {}

    def section(self, name: str) -> Mapping[str, Any]:
        return self._sections.get(name, {})


class Pigeon(Transport[list]):
    """Keeps, per sender thread, the list of what it carried; records every call it gets."""

    name = "pigeon"
    schema: ClassVar[Mapping[str, Any]] = {"type": "object", "properties": {"coop": {"type": "string"}}}

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.open_fails = 0

    def open(self, settings):
        self.calls.append(("open", settings["coop"]))
        if self.open_fails:
            self.open_fails -= 1
            raise OSError("the coop is locked")
        return []

    def open_ahead(self, settings):
        self.calls.append(("open_ahead", settings["coop"]))
        return ["opened ahead"]

    def send(self, message, settings, state):
        state.append(message)
        return SendResult(self.name, ok=True, text=f"carried {len(state)}")

    def probe(self, settings):
        return SendResult(self.name, ok=True, text="the pigeon is back")

    def classify(self, result, message):
        return Classification(Outcome.SENT, "carried")

    def close(self, state):
        self.calls.append(("close", list(state)))


class Raven(Transport[None]):
    """The least a transport writes: a name and send."""

    name = "raven"

    def send(self, message, settings, state):
        return SendResult(self.name, ok=True, text="croak")


def manager(*transports: Transport):
    build = build_plugin_manager(extra=[(t.name, t) for t in transports])
    assert build.errors == []
    return build


def test_each_transport_answers_only_for_its_own_name_and_its_own_results():
    pigeon, raven = Pigeon(), Raven()
    hook = manager(pigeon, raven).pm.hook
    config = Settings("raven", {"pigeon": {"coop": "c"}})
    assert hook.send_message(message="m", transport="raven", config=config, worker_state={}).text == "croak"
    assert hook.send_message(message="m", transport="pigeon", config=config, worker_state={}).text == "carried 1"
    assert hook.send_message(message="m", transport="owl", config=config, worker_state={}) is None
    assert hook.probe_transport(transport="pigeon", config=config).text == "the pigeon is back"
    assert hook.probe_transport(transport="raven", config=config) is None  # raven has no probe: nobody answers
    # A pigeon's result is the pigeon's to classify, whichever transport is active; raven leaves
    # its own to senddock's default (tried last).
    verdict = hook.classify_result(result=SendResult("pigeon", ok=True), message="m", config=config)
    assert verdict.reason == "carried"
    assert hook.classify_result(result=SendResult("raven", ok=True), message="m", config=config).reason == "sent"


def test_a_sender_threads_state_is_opened_at_its_first_send_reused_and_closed_at_its_stop():
    pigeon = Pigeon()
    hook = manager(pigeon).pm.hook
    config = Settings("pigeon", {"pigeon": {"coop": "north"}})
    thread_a, thread_b = {}, {}
    for state, message in ((thread_a, "a1"), (thread_a, "a2"), (thread_b, "b1")):
        hook.send_message(message=message, transport="pigeon", config=config, worker_state=state)
    call_each(hook.worker_stopped, worker_state=thread_a, config=config)
    assert thread_a == {}
    call_each(hook.worker_stopped, worker_state=thread_a, config=config)  # nothing kept: nothing closed twice
    assert pigeon.calls == [("open", "north"), ("open", "north"), ("close", ["a1", "a2"])]
    assert list(thread_b.values()) == [["b1"]]


def test_an_open_that_raises_is_that_sends_failure_and_the_next_send_opens_again():
    pigeon = Pigeon()
    pigeon.open_fails = 1
    pm = manager(pigeon).pm
    config, state = Settings("pigeon", {"pigeon": {"coop": "c"}}), {}
    failed = results.send(pm, config, "m1", state)  # the engine's capture of a send, as a sender thread does
    assert (failed.transport, failed.ok, type(failed.error)) == ("pigeon", False, OSError)
    assert state == {}  # nothing kept: nothing to close
    assert results.send(pm, config, "m2", state).ok
    assert [call[0] for call in pigeon.calls] == ["open", "open"]


def test_open_ahead_runs_in_worker_started_of_the_active_transport_only():
    pigeon = Pigeon()
    hook = manager(pigeon).pm.hook
    state = {}
    call_each(hook.worker_started, worker_state=state, config=Settings("raven", {"pigeon": {"coop": "c"}}))
    assert state == {} and pigeon.calls == []
    config = Settings("pigeon", {"pigeon": {"coop": "c"}})
    call_each(hook.worker_started, worker_state=state, config=config)
    hook.send_message(message="m", transport="pigeon", config=config, worker_state=state)
    assert pigeon.calls == [("open_ahead", "c")]  # the first send used what was opened ahead
    assert list(state.values()) == [["opened ahead", "m"]]


def test_a_transport_registers_only_the_hooks_its_methods_give_something_to_do():
    rows = {row["name"]: row["hooks"] for row in describe(manager(Pigeon(), Raven()).pm, {})}
    assert rows["raven"] == ["send_message", "transport_names"]
    assert rows["pigeon"] == ["classify_result", "config_schema", "probe_transport", "send_message",
                              "transport_names", "worker_started", "worker_stopped"]

    class Owl(Raven):  # a subclass of a transport without probe, that has one
        name = "owl"

        def probe(self, settings):
            return SendResult(self.name, ok=True)

    assert "probe_transport" in {row["name"]: row["hooks"] for row in describe(manager(Owl()).pm, {})}["owl"]


def test_a_transport_without_a_name_is_an_error_naming_it():
    class Nameless(Transport[None]):
        def send(self, message, settings, state):
            return SendResult("?", ok=True)

    build = build_plugin_manager(extra=[("nameless", Nameless())])
    assert any("Nameless names no transport" in error for error in build.errors), build.errors


KESTREL = '''
from senddock import Transport{imports}
from senddock.outcome import SendResult

class Kestrel(Transport):
    name = "kestrel{n}"

    def send(self, message, settings, state):
        return SendResult(self.name, ok=True)
{more}
plugin = Kestrel()
'''


def kestrel_module(site: Path, module: str, *, imports: str = "", more: str = "") -> str:
    (site / f"{module}.py").write_text(KESTREL.format(n=module[-1], imports=imports, more=textwrap.dedent(more)),
                                       encoding="utf-8")
    return module


def test_a_module_that_holds_a_transport_is_registered_as_it(site: Path):
    module = kestrel_module(site, "acme_kestrel1")
    build = build_plugin_manager(load=[module])
    assert build.errors == []
    assert build.transports["kestrel1"] == module  # the plugin keeps the module's name (plugins.disable)
    assert isinstance(build.pm.get_plugin(module), Transport)


def test_a_module_with_a_transport_and_hooks_of_its_own_beside_it_is_an_error(site: Path):
    module = kestrel_module(site, "acme_kestrel2", imports=", hookimpl", more="""
        @hookimpl
        def compute_backoff(attempt):
            return None
        """)
    build = build_plugin_manager(load=[module])
    assert any(f"plugin {module!r} ({module}) holds module-level hooks (compute_backoff) beside its Kestrel" in e
               for e in build.errors), build.errors
    assert module not in build.origins


def test_a_module_with_two_transports_is_an_error(site: Path):
    module = kestrel_module(site, "acme_kestrel3", more="""
        class Falcon(Kestrel):
            name = "falcon"

        falcon = Falcon()
        """)
    build = build_plugin_manager(load=[module])
    assert any("holds 2 transports: give each a module of its own" in e for e in build.errors), build.errors


def test_call_each_calls_every_implementation_in_pluggys_order_even_after_one_raises():
    from senddock import plugins

    called: list[str] = []

    def plugin(label: str, *, fails: bool = False, **order: bool) -> SimpleNamespace:
        @hookimpl(**order)
        def worker_started(worker_state):
            called.append(label)
            if fails:
                raise KeyError(f"bug in {label}")

        return SimpleNamespace(worker_started=worker_started)

    pm = build_plugin_manager(extra=[("last", plugin("last", trylast=True)), ("first", plugin("first", fails=True,
                                     tryfirst=True)), ("middle", plugin("middle", fails=True))]).pm
    with captured_logs(plugins) as logs:
        call_each(pm.hook.worker_started, worker_state={}, config=Settings("raven"))
    assert called == ["first", "middle", "last"]
    assert [(e["event"], e["hook"], e["plugin"]) for e in logs] == [
        ("plugin_failed", "worker_started", "first"), ("plugin_failed", "worker_started", "middle")]
