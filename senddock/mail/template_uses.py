"""What a template reads: every variable path it uses, read off Jinja2's AST before any render.

``campaign create`` uses it to refuse a variable that can never exist, and ``campaign send`` to
know which subscriber attributes every recipient must have. It errs towards silence: a use it
cannot judge (a name the template defines itself, an index computed at render time) is left to the
render, which is still checked for a sample of recipients and by the senders.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from jinja2 import nodes

# `x | default(...)` and `x is defined` / `x is undefined` never fail on a missing x.
_GUARD_FILTERS = frozenset({"default", "d"})
_GUARD_TESTS = frozenset({"defined", "undefined"})
# Names Jinja2 defines inside loops, macros and call blocks.
_IMPLICIT = frozenset({"loop", "caller", "varargs", "kwargs", "self"})


@dataclass(frozen=True)
class Use:
    """One read of a variable path, e.g. ``("subscriber", "attributes", "city")`` on line 2.

    ``attr``: whether each segment was written ``.name`` (True) or ``["name"]`` (False): on a dict
    ``.items`` is the method, ``["items"]`` the key. ``guarded``: under ``| default`` or an
    ``is defined`` test. ``always``: read on every render (not in a branch, a loop, a macro or the
    right side of ``and``/``or``), so a recipient without it cannot render at all. ``printed``:
    written out as it is (``{{ x }}``, ``{{ x | title }}``), with no ``default(..., true)`` to stand
    in for an empty value: an empty one leaves a gap in the text (``Hi ,``).
    """

    path: tuple[str, ...]
    attr: tuple[bool, ...]
    line: int
    guarded: bool
    always: bool
    printed: bool = False


def uses(template: nodes.Template, known_globals: frozenset[str]) -> list[Use]:
    """Every read of a variable the render context must supply (the template's own names left out)."""
    local = _defined_names(template) | known_globals | _IMPLICIT
    walker = _Walker(local)
    walker.body(template.body, frozenset(), True)
    return walker.found


def _defined_names(template: nodes.Template) -> frozenset[str]:
    """Names the template defines anywhere (set, for, macro, with, call, import). Jinja2's scoping
    rules are not replayed: a name defined anywhere is taken as defined everywhere, so a use is
    never refused for want of understanding a scope."""
    names = {n.name for n in template.find_all(nodes.Name) if n.ctx in ("store", "param")}
    names.update(m.name for m in template.find_all(nodes.Macro))
    names.update(i.target for i in template.find_all(nodes.Import))
    for imported in template.find_all(nodes.FromImport):
        names.update(n[1] if isinstance(n, tuple) else n for n in imported.names)
    return frozenset(names)


def _guards(test: nodes.Node) -> frozenset[tuple[str, ...]]:
    """The paths a condition tests with ``is defined`` / ``is undefined``."""
    found = set()
    for node in _nodes_of(test, nodes.Test):
        if node.name in _GUARD_TESTS and (chain := _chain(node.node)) is not None:
            found.add(chain[0])
    return frozenset(found)


def _covers_empty(default: nodes.Filter) -> bool:
    """``default(x, true)`` / ``default(x, boolean=true)``: also used for an empty value."""
    flag = default.args[1] if len(default.args) > 1 else next(
        (k.value for k in default.kwargs if k.key == "boolean"), None)
    return isinstance(flag, nodes.Const) and bool(flag.value)


def _nodes_of(node: nodes.Node, kind: type) -> Iterator[nodes.Node]:
    if isinstance(node, kind):
        yield node
    yield from node.find_all(kind)


def _chain(node: nodes.Node) -> tuple[tuple[str, ...], tuple[bool, ...], nodes.Name, list[nodes.Node]] | None:
    """``a.b["c"][x].d`` as (("a", "b", "c"), kinds, the Name a, [x]): the path up to the first index
    computed at render time, and the expressions inside such indexes. None when the chain does not
    start at a plain name (``f().x``)."""
    segments: list[tuple[str, bool]] = []
    dynamic: list[nodes.Node] = []
    while True:
        if isinstance(node, nodes.Getattr):
            segments.append((node.attr, True))
            node = node.node
        elif isinstance(node, nodes.Getitem):
            if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
                segments.append((node.arg.value, False))
            else:  # what follows an index known only at render time cannot be judged
                segments.clear()
                dynamic.append(node.arg)
            node = node.node
        elif isinstance(node, nodes.Name) and node.ctx == "load":
            segments.reverse()
            path = (node.name, *(name for name, _ in segments))
            return path, (True, *(attr for _, attr in segments)), node, dynamic
        else:
            return None


class _Walker:
    def __init__(self, local: frozenset[str]) -> None:
        self.local = local
        self.found: list[Use] = []

    def body(self, body: list[nodes.Node], guarded: frozenset, always: bool) -> None:
        for node in body:
            self.node(node, guarded, always)

    def node(self, node: nodes.Node | None, guarded: frozenset, always: bool, *, guard: bool = False,
             printed: bool = False) -> None:
        if node is None:
            return
        if isinstance(node, (nodes.Name, nodes.Getattr, nodes.Getitem)):
            chain = _chain(node)
            if chain is not None:
                path, kinds, name, dynamic = chain
                if name.name not in self.local:
                    covered = guard or any(path[:len(g)] == g for g in guarded)
                    self.found.append(Use(path, kinds, node.lineno, covered, always, printed))
                for expression in dynamic:
                    self.node(expression, guarded, always)
                return
        if isinstance(node, nodes.Output):
            for child in node.nodes:
                self.node(child, guarded, always, printed=True)
        elif isinstance(node, nodes.Filter) and node.name in _GUARD_FILTERS:
            # `default(x)` stands in for a missing value only; `default(x, true)` for an empty one too.
            self.node(node.node, guarded, always, guard=True, printed=printed and not _covers_empty(node))
            self.each(node, guarded, always, skip={"node"})
        elif isinstance(node, nodes.Filter) and printed:
            self.node(node.node, guarded, always, printed=True)  # `| title`, `| upper`: empty stays empty
            self.each(node, guarded, always, skip={"node"})
        elif isinstance(node, nodes.Test) and node.name in _GUARD_TESTS:
            self.node(node.node, guarded, always, guard=True)
            self.each(node, guarded, always, skip={"node"})
        elif isinstance(node, (nodes.If, nodes.CondExpr)):
            self.node(node.test, guarded, always)
            inner = guarded | _guards(node.test)
            if isinstance(node, nodes.If):
                self.body(node.body, inner, False)
                self.body(node.elif_, inner, False)
                self.body(node.else_, inner, False)
            else:
                self.node(node.expr1, inner, False)
                self.node(node.expr2, inner, False)
        elif isinstance(node, (nodes.And, nodes.Or)):
            self.node(node.left, guarded, always)
            self.node(node.right, guarded | _guards(node.left), False)
        elif isinstance(node, nodes.For):
            self.node(node.iter, guarded, always)
            self.node(node.test, guarded, False)
            self.body(node.body, guarded, False)
            self.body(node.else_, guarded, False)
        elif isinstance(node, nodes.Macro):
            self.body(node.defaults, guarded, False)
            self.body(node.body, guarded, False)
        elif isinstance(node, nodes.CallBlock):
            self.node(node.call, guarded, always)
            self.body(node.defaults, guarded, False)
            self.body(node.body, guarded, False)
        else:
            self.each(node, guarded, always)

    def each(self, node: nodes.Node, guarded: frozenset, always: bool, skip: set[str] = frozenset()) -> None:
        for name in node.fields:
            if name in skip:
                continue
            value = getattr(node, name, None)
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, nodes.Node):
                    self.node(child, guarded, always)
