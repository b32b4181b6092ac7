"""The house's shape, read from the code's own imports: data flows one way, and README's "Layout"
names every folder there is.

Every import counts, the ones inside functions included: an import deferred for speed still
closes a circle for a reader and for the next refactor.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path


# The checkout's source, not an installed copy (CI installs senddock into a virtualenv).
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "senddock"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if MODULES[module].name != "__init__.py":
                package = package[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    targets = []
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module and name != "senddock":
            targets.append(name)
    return targets


def _import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(_imported(module, node))
    return graph


GRAPH = _import_graph()


def room(module: str) -> str:
    """A module's folder under senddock/ (``senddock.core``), or the top-level module itself."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()):
        return ".".join(parts[:2])
    return module


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def _arrows(source_room: str, target_room: str) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                  if room(a) == source_room and room(b) == target_room)


def test_the_graph_sees_imports_inside_functions():
    # loading builds the plugin manager inside load_config: if the walk missed that, it would see nothing.
    assert "senddock.plugins" in GRAPH["senddock.loading"]
    assert "senddock.core.claimer" in GRAPH["senddock.core.runner"]


def test_no_module_imports_one_that_imports_it_back():
    assert _circles(GRAPH) == []


def test_no_folder_imports_one_that_imports_it_back():
    rooms: dict[str, set[str]] = defaultdict(set)
    for module, targets in GRAPH.items():
        for target in targets:
            if room(module) != room(target):
                rooms[room(module)].add(room(target))
    circles = _circles(rooms)
    detail = {" <-> ".join(c): [arrow for a in c for b in c for arrow in _arrows(a, b)] for c in circles}
    assert detail == {}


# What each layer may not import: cli / web -> api -> domain -> core (the engine) -> store, and
# config is data that imports no feature.
FORBIDDEN = {
    "senddock.store": {"senddock.core", "senddock.domain", "senddock.api", "senddock.cli", "senddock.web",
                       "senddock.webhooks", "senddock.observe", "senddock.bounces", "senddock.loading",
                       "senddock.plugins"},
    "senddock.core": {"senddock.domain", "senddock.api", "senddock.cli", "senddock.web"},
    "senddock.domain": {"senddock.api", "senddock.cli", "senddock.web", "senddock.core.runner"},
    "senddock.config": {"senddock.core", "senddock.domain", "senddock.store", "senddock.api", "senddock.cli",
                        "senddock.web", "senddock.webhooks", "senddock.observe", "senddock.bounces",
                        "senddock.mail", "senddock.plugins", "senddock.defaults", "senddock.loading"},
    "senddock.api": {"senddock.cli", "senddock.web"},
}


def test_each_layer_imports_only_below_it():
    wrong = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() for target in targets
                   for below in [FORBIDDEN.get(room(module), set())]
                   if any(target == f or target.startswith(f + ".") for f in below))
    assert wrong == []


def test_readme_layout_names_every_folder_and_only_real_ones():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\bsenddock/([\w/]+)/", section))
    folders = {str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert folders - named == set(), "folders README's Layout does not name"
    assert {n for n in named if not (PACKAGE / n).is_dir()} == set(), "README's Layout names folders that are gone"
    modules = set(re.findall(r"\bsenddock/(\w+\.py)\b", section))
    assert {m for m in modules if not (PACKAGE / m).is_file()} == set(), "README's Layout names modules that are gone"


_FLAG = re.compile(r"(?<![\w`-])--[a-z][\w-]*")


def test_errors_below_the_cli_name_values_not_flags():
    # The CLI words its own flags (senddock.cli.words); an error raised below it names the value
    # ({=send_at}), so the Python API, the dashboard and the HTTP API never show a flag they lack.
    # A whole command quoted as advice (`senddock campaign log 3 --outcome bounce`) is not a flag.
    found = []
    for module, path in MODULES.items():
        if room(module) in ("senddock.cli", "senddock.chaos") or module in ("senddock.sink", "senddock.demo"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                texts = [c.value for c in ast.walk(node.exc) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                for text in texts:
                    unquoted = re.sub(r"`[^`]*`", "", text)
                    found += [f"{module}:{node.lineno}: {flag}" for flag in _FLAG.findall(unquoted)]
    assert found == []
