"""A base class for transport plugins: write ``open``, ``send``, ``probe``, ``classify`` and ``close``.

Every transport implements the same hooks the same way: answer ``send_message`` and
``probe_transport`` only when the active transport is its own, ``classify_result`` only for its own
results, keep one connection per sender thread in ``worker_state``, and close it in
``worker_stopped``. :class:`Transport` does that once, over those hooks: they stay the contract
(:mod:`senddock.hooks`), and a subclass instance is a plugin like any module of ``@hookimpl``
functions. Other hooks (``config_problems``, ``parse_provider_event``...) are methods of the
subclass marked ``@hookimpl``.

Registered by name: ``name`` is the transport's (``transport: NAME`` selects it), ``section`` the
config section its methods get as ``settings`` (the name, unless given). Point the ``senddock``
entry point at the module that holds the instance (``maildir = "senddock_maildir.transport"``), as
for any plugin, or at the instance itself (``"senddock_maildir.transport:plugin"``).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from senddock.hooks import hookimpl

if TYPE_CHECKING:
    from senddock.outcome import Classification, Message, PluginConfig, SendResult

State = TypeVar("State")

# The methods that give each optional hook something to do. A subclass that overrides none of them
# goes without the hook (and one without a ``schema`` without ``config_schema``), so ``senddock
# plugins`` lists only the hooks a transport really has.
_HOOK_NEEDS = {
    "worker_started": ("open_ahead",),
    "probe_transport": ("probe",),
    "classify_result": ("classify",),
    "worker_stopped": ("open", "close"),
}


class Transport(Generic[State]):
    """Subclass it, give ``name``, implement :meth:`send`, and put one instance in the plugin module.

    ``State`` is what :meth:`open` returns for each sender thread (a connection, a client, a folder),
    handed to every :meth:`send` of that thread and to :meth:`close` when it stops.
    """

    name: ClassVar[str]
    section: ClassVar[str | None] = None
    schema: ClassVar[Mapping[str, Any] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for hook, methods in _HOOK_NEEDS.items():
            if hook in cls.__dict__:
                continue  # the subclass implements the hook itself
            used = any(getattr(cls, method) is not getattr(Transport, method) for method in methods)
            setattr(cls, hook, getattr(Transport, hook) if used else None)
        if "config_schema" not in cls.__dict__:
            cls.config_schema = Transport.config_schema if cls.schema is not None else None  # type: ignore[method-assign,assignment]

    # What to override.

    def open(self, settings: Mapping[str, Any]) -> State:
        """Make a sender thread's state, at its first send. What this raises is that send's failure
        (captured and classified like a failed send), and the next send calls it again."""
        return None  # type: ignore[return-value]  # a transport that keeps nothing

    def open_ahead(self, settings: Mapping[str, Any]) -> State | None:
        """Make a sender thread's state as the node starts, before its first claim (a connection
        opened ahead); None, the default, leaves it to :meth:`open` at the first send.

        Not called by ``send-test``. A failure here is no send: return None (or a state with
        nothing open) and let the first send report what goes wrong. What this raises is logged."""
        return None

    def send(self, message: Message, settings: Mapping[str, Any], state: State) -> SendResult:
        """Send one message; see the ``send_message`` hook. Raising is allowed (a failed send)."""
        raise NotImplementedError(f"{type(self).__name__} must implement send()")

    def probe(self, settings: Mapping[str, Any]) -> SendResult | None:
        """Does the relay or API answer, without sending? See ``probe_transport``; None: cannot tell."""
        return None

    def classify(self, result: SendResult, message: Message) -> Classification | None:
        """What one of this transport's results means; None leaves it to senddock's default rules."""
        return None

    def close(self, state: State) -> None:
        """Release a sender thread's state as the thread stops (after ``send-test``'s send too)."""

    # The hooks, implemented once for every transport.

    def _state_key(self) -> str:
        # A method, not a property: pluggy reads every attribute of a plugin as it registers it.
        return f"senddock.transport:{self.name}"

    def settings(self, config: PluginConfig) -> Mapping[str, Any]:
        """This transport's config section, its schema's defaults filled in."""
        return config.section(self.section or self.name)

    @hookimpl
    def transport_names(self) -> list[str]:
        if not getattr(self, "name", None):
            raise TypeError(f"{type(self).__name__} names no transport: give it a class attribute `name`")
        return [self.name]

    @hookimpl
    def config_schema(self) -> Mapping[str, Mapping[str, Any]] | None:
        return None if self.schema is None else {self.section or self.name: self.schema}

    @hookimpl
    def worker_started(self, worker_state: MutableMapping[str, Any], config: PluginConfig) -> None:
        if config.transport != self.name or self._state_key() in worker_state:
            return
        state = self.open_ahead(self.settings(config))
        if state is not None:
            worker_state[self._state_key()] = state

    @hookimpl
    def send_message(
        self, message: Message, transport: str, config: PluginConfig, worker_state: MutableMapping[str, Any]
    ) -> SendResult | None:
        if transport != self.name:
            return None
        settings, key = self.settings(config), self._state_key()
        try:
            state = worker_state[key]
        except KeyError:
            state = worker_state[key] = self.open(settings)
        return self.send(message, settings, state)

    @hookimpl
    def probe_transport(self, transport: str, config: PluginConfig) -> SendResult | None:
        return self.probe(self.settings(config)) if transport == self.name else None

    @hookimpl
    def classify_result(self, result: SendResult, message: Message) -> Classification | None:
        # The transport that produced a result decides about it, whichever is active now.
        return self.classify(result, message) if result.transport == self.name else None

    @hookimpl
    def worker_stopped(self, worker_state: MutableMapping[str, Any]) -> None:
        key = self._state_key()
        if key in worker_state:  # whatever the active transport: what this one kept, it closes
            self.close(worker_state.pop(key))
