from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path

import pytest

from senddock import hooks
from senddock.loading import load_config
from senddock.errors import ConfigError
from senddock.outcome import Classification, Outcome, SendResult
from senddock.plugins import build_plugin_manager, describe

PLUGIN_SOURCE = '''
from senddock import hookimpl
from senddock.outcome import SendResult

@hookimpl
def transport_names():
    return ["{transport}"]

@hookimpl
def config_schema():
    return {{"{transport}": {{
        "type": "object", "additionalProperties": False,
        "properties": {{"endpoint": {{"type": "string", "default": "http://localhost"}}}},
    }}}}

@hookimpl
def send_message(message, transport, config):
    if transport != "{transport}":
        return None
    return SendResult(transport="{transport}", ok=True, text=config.section("{transport}")["endpoint"])
'''


def install_fake_distribution(site: Path, module: str, transport: str, dist: str = "acme-senddock") -> None:
    """A real installed distribution (dist-info + entry point), as pip would leave it."""
    (site / f"{module}.py").write_text(PLUGIN_SOURCE.format(transport=transport), encoding="utf-8")
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[senddock]\n{transport} = {module}\n", encoding="utf-8")


def test_builtins_are_registered_through_the_entry_point_group():
    """What the built-ins register; a third-party plugin installed beside them (a plugin author
    running this suite in their virtualenv) may add its own, as an entry point."""
    build = build_plugin_manager()
    assert build.errors == []
    builtins = {"senddock.defaults": "built-in", "smtp": "built-in", "ses_like": "built-in"}
    assert {name: origin for name, origin in build.origins.items() if origin == "built-in"} == builtins
    assert all(origin == "built-in" or origin.startswith("entry point") for origin in build.origins.values())
    assert {"smtp": "smtp", "ses_like": "ses_like"}.items() <= build.transports.items()
    assert {"smtp", "ses_like"} <= set(build.config_schemas)


def test_builtin_transports_are_separate_packages_not_a_plugins_package():
    import senddock_ses_like
    import senddock_smtp

    for module in (senddock_smtp, senddock_ses_like):
        source = inspect.getsource(module)
        assert "senddock.core" not in source  # plugins never import the engine
    assert "plugins" not in sys.modules or not hasattr(sys.modules["plugins"], "__path__")


def test_third_party_plugin_through_an_entry_point(site: Path, tmp_path: Path):
    install_fake_distribution(site, "acme_pigeon", "pigeon")
    config_path = tmp_path / "c.yaml"
    config_path.write_text("transport: pigeon\npigeon:\n  endpoint: http://coop\n", encoding="utf-8")
    config = load_config(config_path, environ={})
    assert config.plugin_origins["pigeon"] == "entry point (acme-senddock)"
    assert config.transport_providers["pigeon"] == "pigeon"
    result = config.plugin_manager.hook.send_message(message=None, transport="pigeon", config=config, worker_state={})
    assert result == SendResult(transport="pigeon", ok=True, text="http://coop")
    # Its section is validated as strictly as senddock's own.
    config_path.write_text("transport: pigeon\npigeon:\n  endpont: x\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(config_path, environ={})
    assert caught.value.errors == [f"{config_path}::$.pigeon.endpont: unknown key 'endpont' (did you mean 'endpoint'?)"]


def test_plugin_named_in_plugins_load(site: Path, tmp_path: Path):
    (site / "acme_audit.py").write_text(PLUGIN_SOURCE.format(transport="audit"), encoding="utf-8")
    config_path = tmp_path / "c.yaml"
    config_path.write_text("plugins:\n  load: [acme_audit]\ntransport: audit\n", encoding="utf-8")
    config = load_config(config_path, environ={})
    assert config.plugin_origins["acme_audit"] == "config (plugins.load)"
    assert config.transport == "audit"
    rows = {r["name"]: r for r in describe(config.plugin_manager, config.plugin_origins)}
    assert rows["acme_audit"]["hooks"] == ["config_schema", "send_message", "transport_names"]


def test_plugins_load_of_a_missing_module_is_a_config_error(tmp_path: Path):
    config_path = tmp_path / "c.yaml"
    config_path.write_text("plugins:\n  load: [acme_nowhere]\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(config_path, environ={})
    assert caught.value.errors[0].startswith(f"{config_path}::$.plugins.load[0]: cannot import 'acme_nowhere'")


def test_disabled_plugin_is_not_registered(tmp_path: Path):
    config_path = tmp_path / "c.yaml"
    config_path.write_text("plugins:\n  disable: [ses_like]\n", encoding="utf-8")
    config = load_config(config_path, environ={})
    assert "ses_like" not in config.plugin_origins
    assert "ses_like" not in config.transport_providers
    # ...and its section is then an unknown key.
    config_path.write_text("plugins:\n  disable: [ses_like]\nses_like:\n  region: eu-west-1\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        load_config(config_path, environ={})


def test_disabling_an_unknown_plugin_is_an_error(tmp_path: Path):
    config_path = tmp_path / "c.yaml"
    config_path.write_text("plugins:\n  disable: [smtpp]\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(config_path, environ={})
    assert "$.plugins.disable[0]: no plugin is named 'smtpp'" in caught.value.errors[0]


def test_misspelled_hookimpl_fails_at_start(site: Path):
    (site / "acme_typo.py").write_text(
        "from senddock import hookimpl\n\n@hookimpl\ndef send_mesage(message):\n    return None\n", encoding="utf-8"
    )
    build = build_plugin_manager(load=["acme_typo"])
    assert any("send_mesage" in e for e in build.errors), build.errors


def test_two_plugins_providing_one_transport_is_an_error(site: Path):
    (site / "acme_smtp2.py").write_text(PLUGIN_SOURCE.format(transport="smtp").replace(
        'def config_schema():\n    return {"smtp"', 'def config_schema():\n    return {"smtp2"'), encoding="utf-8")
    build = build_plugin_manager(load=["acme_smtp2"])
    assert any("transport 'smtp' is provided by both 'smtp' and 'acme_smtp2'" in e for e in build.errors), build.errors


def test_defaults_are_tried_last():
    class Strict:
        @hooks.hookimpl
        def classify_result(self, result):
            return Classification(Outcome.FAIL, "strict")

    build = build_plugin_manager(extra=[("strict", Strict())])
    verdict = build.pm.hook.classify_result(result=SendResult("smtp", ok=True), message=None, config=None)
    assert verdict.reason == "strict"


@pytest.mark.parametrize("name", [n for n, f in vars(hooks).items() if hasattr(f, "senddock_spec")])
def test_every_hook_spec_is_documented(name: str):
    spec = getattr(hooks, name)
    doc = inspect.getdoc(spec)
    assert doc, f"{name} has no docstring"
    for parameter in inspect.signature(spec).parameters:
        assert f":param {parameter}:" in doc, f"{name} does not document {parameter}"
    assert ":return:" in doc
    # Each says whether it stops at the first result or calls every implementation.
    if spec.senddock_spec.get("firstresult"):
        assert "Return None to let other plugins decide; the first non-None result wins." in " ".join(doc.split())
    else:
        assert "Every implementation is called (not firstresult)" in " ".join(doc.split())


@pytest.mark.parametrize("name", [n for n, f in vars(hooks).items() if hasattr(f, "senddock_spec")])
def test_every_hook_spec_is_named_in_the_readme_and_in_docs_plugins(name: str):
    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    plugins_section = readme.split("\n## Plugins\n", 1)[1].split("\n## ", 1)[0]
    assert f"`{name}`" in plugins_section, f"README's Plugins section does not name {name}"
    table = (repo / "docs" / "plugins.md").read_text(encoding="utf-8").split("\n## The hooks\n", 1)[1]
    assert f"| `{name}(" in table, f"docs/plugins.md's hook table has no row for {name}"


def test_the_four_core_hooks_exist_with_the_agreed_firstresult():
    specs = {n: f.senddock_spec for n, f in vars(hooks).items() if hasattr(f, "senddock_spec")}
    assert {n: s["firstresult"] for n, s in specs.items() if n in
            ("send_message", "classify_result", "on_bounced", "compute_backoff")} == {
        "send_message": True, "classify_result": True, "on_bounced": False, "compute_backoff": True}


def test_plugin_packages_carry_their_own_pyproject():
    repo = Path(__file__).resolve().parents[2]
    for name in ("smtp", "ses_like"):
        text = (repo / "plugins" / name / "pyproject.toml").read_text(encoding="utf-8")
        assert "[project.entry-points.senddock]" in text
        assert f'{name} = "senddock_{name}"' in textwrap.dedent(text)


def test_the_transport_example_in_docs_plugins_is_the_example_package_s_own():
    """The documented example is the one the example package's tests and senddock's suite run."""
    repo = Path(__file__).resolve().parents[2]
    source = (repo / "examples/senddock-maildir/src/senddock_maildir/transport.py").read_text(encoding="utf-8")
    docs = (repo / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = docs.split("\n### A transport: `senddock.Transport`\n", 1)[1]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert example == source[source.index("import mailbox"):]


def test_plugins_import_only_the_surface_docs_plugins_lists():
    """The built-in transports and the example package are shaped like any third-party plugin:
    what they import of senddock is what docs/plugins.md says a plugin may import."""
    import ast
    import importlib.util

    def module_of(module: str, name: str) -> str:
        """What ``from module import name`` imports: the submodule ``name``, or from ``module``."""
        try:
            return f"{module}.{name}" if importlib.util.find_spec(f"{module}.{name}") else module
        except ModuleNotFoundError:  # ``module`` is no package
            return module

    repo = Path(__file__).resolve().parents[2]
    docs = (repo / "docs" / "plugins.md").read_text(encoding="utf-8")
    listed = docs.split("\n### What a plugin may import\n", 1)[1].split("\n## ", 1)[0]
    surface = {line.split("`")[1] for line in listed.splitlines() if line.startswith("- `")}
    imported: dict[str, set[str]] = {}
    for path in [*(repo / "plugins").rglob("*.py"), *(repo / "examples").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = {module_of(node.module, alias.name) for alias in node.names}
            elif isinstance(node, ast.Import):
                modules = {alias.name for alias in node.names}
            else:
                continue
            for module in modules:
                if module.split(".")[0] == "senddock":
                    imported.setdefault(module, set()).add(str(path.relative_to(repo)))
    assert {module: sorted(paths) for module, paths in imported.items() if module not in surface} == {}
    # The check sees what they import: the base class, VERP for SMTP's return path, mime, testing.
    assert {"senddock", "senddock.mail.verp", "senddock.mail.mime", "senddock.testing"} <= set(imported)
