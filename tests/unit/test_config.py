from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import yaml
from tests_support import installed_transports

from senddock.config import find_config_path
from senddock.loading import load_config
from senddock.errors import ConfigError
from senddock.mail.unsubscribe import missing_links

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "senddock.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def errors_of(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=environ or {})
    return caught.value.errors


def test_shipped_config_is_valid_and_uses_the_embedded_database_and_local_smtp():
    secret = "a-newcomer-made-this-one-32-chars"
    config = load_config(REPO / "config" / "senddock.yaml", environ={"SENDDOCK_UNSUBSCRIBE_SECRET": secret})
    assert config.database.dsn is None
    assert config.database.embedded_path == (REPO / ".senddock" / "pgdata").resolve()
    assert config.transport == "smtp"
    assert (config.section("smtp")["host"], config.section("smtp")["port"]) == ("127.0.0.1", 1025)
    # Unsubscribe links point at `senddock serve` on this machine, signed with the secret from the
    # environment: `campaign send` has what it requires, and no secret is written in the file.
    unsubscribe = config.unsubscribe
    assert (unsubscribe.url, unsubscribe.secret) == (f"http://127.0.0.1:{config.serve.port}", secret)
    assert missing_links(unsubscribe) is None


def test_shipped_config_names_the_unsubscribe_secret_it_needs():
    assert errors_of(REPO / "config" / "senddock.yaml") == [
        f"{REPO / 'config' / 'senddock.yaml'}::$.unsubscribe.secret: environment variable SENDDOCK_UNSUBSCRIBE_SECRET "
        "is not set"]


def test_defaults():
    config = load_config(None, environ={})
    assert config.concurrency == 50 and config.claim_batch == 50
    assert config.retry.schedule == (30, 120, 480, 1800, 3600)
    assert config.retry.max_retries == 5
    assert config.retry.jitter == 0.1
    assert (config.recovery.heartbeat, config.recovery.lease, config.recovery.in_doubt) == (5, 30, "retry")
    assert config.logging.format == "auto"
    assert config.node_name is None  # chosen at start: the first free of HOST, HOST-2...
    assert config.retry.max_age == 5 * 86400
    assert (config.breaker.bounce_rate, config.breaker.bounce_window) == (0.2, 100)
    assert (config.breaker.early_bounces, config.breaker.early_window) == (5, 10)


def test_embedded_path_is_relative_to_the_config_file(tmp_path: Path):
    path = write(tmp_path, "database:\n  embedded:\n    path: data/pg\n")
    assert load_config(path, environ={}).database.embedded_path == (tmp_path / "data" / "pg").resolve()


def test_bad_duration_is_reported_with_file_and_json_path(tmp_path: Path):
    path = write(tmp_path, "retry:\n  schedule: [30s, 2m, soon]\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}::$.retry.schedule[2]: 'soon' is not a duration")


def test_serve_limits_have_defaults_and_bad_ones_are_reported(tmp_path: Path):
    serve = load_config(None, environ={}).section("serve")
    assert (serve["max_body"], serve["body_timeout"], serve["header_timeout"], serve["max_connections"],
            serve["keep_alive_timeout"], serve["sns_certificate_timeout"]) == ("256KiB", "10s", "10s", 100, "5s", "5s")
    path = write(tmp_path, "serve:\n  max_body: 256kb\n  header_timeout: soon\n  max_connections: 0\n")
    assert errors_of(path) == [
        f"{path}::$.serve.header_timeout: 'soon' is not a duration (e.g. 30s, 2m, 1h30m)",
        f"{path}::$.serve.max_body: '256kb' is not a size (e.g. 256KiB, 1MiB, or a number of bytes)",
        f"{path}::$.serve.max_connections: 0 is less than the minimum of 1",
    ]
    path = write(tmp_path, "serve:\n  max_body: 100\n  body_timeout: 0s\n")
    assert errors_of(path) == [
        f"{path}::$.serve.max_body: must be at least 1KiB (100): an SNS notification alone is larger",
        f"{path}::$.serve.body_timeout: must be longer than 0s",
    ]
    path = write(tmp_path, "serve:\n  max_body: ${MAX_BODY}\n")
    assert load_config(path, environ={"MAX_BODY": "1MiB"}).section("serve")["max_body"] == "1MiB"


def test_misspelled_key_is_an_error_with_a_suggestion_at_every_level(tmp_path: Path):
    path = write(tmp_path, "workrs: 3\nretry:\n  jiter: 0.2\nsmtp:\n  hots: mail\n")
    errors = errors_of(path)
    assert f"{path}::$.workrs: unknown key 'workrs' (did you mean 'workers'?)" in errors
    assert f"{path}::$.retry.jiter: unknown key 'jiter' (did you mean 'jitter'?)" in errors
    # A plugin's own section is validated as strictly as senddock's.
    assert f"{path}::$.smtp.hots: unknown key 'hots' (did you mean 'host'?)" in errors


def test_every_error_is_collected(tmp_path: Path):
    path = write(tmp_path, "workers: 0\ntransport: 7\nlogging:\n  level: loud\n")
    errors = errors_of(path)
    assert [e.split("::")[1].split(":")[0] for e in errors] == ["$.logging.level", "$.transport", "$.workers"]


def test_missing_environment_variable_names_the_key(tmp_path: Path):
    path = write(tmp_path, "smtp:\n  host: ${SMTP_HOST}\n")
    assert errors_of(path) == [f"{path}::$.smtp.host: environment variable SMTP_HOST is not set"]


def test_environment_values_are_substituted_then_validated_again(tmp_path: Path):
    path = write(tmp_path, "smtp:\n  port: ${SMTP_PORT}\n  host: ${SMTP_HOST:-relay.local}\n")
    config = load_config(path, environ={"SMTP_PORT": "2525"})
    assert config.section("smtp")["port"] == 2525
    assert config.section("smtp")["host"] == "relay.local"
    [error] = errors_of(path, {"SMTP_PORT": "twenty"})
    assert error == f"{path}::$.smtp.port: 'twenty' is not of type 'integer' (from ${{SMTP_PORT}})"


def test_secrets_written_in_the_file_are_refused(tmp_path: Path):
    path = write(tmp_path, "database:\n  dsn: postgresql://app:hunter2@db.internal/mail\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}::$.database.dsn: the DSN holds a password")
    assert "hunter2" not in error


def test_a_secret_of_the_wrong_type_or_length_is_never_printed(tmp_path: Path):
    path = write(tmp_path, "bounces:\n  secret: 123456789012345678901234\n  mailbox: {password: [hunter2pass]}\n")
    errors = errors_of(path)
    assert errors == [
        f"{path}::$.bounces.mailbox.password: must be text from the environment (${{NAME}}), not a list",
        f"{path}::$.bounces.mailbox.password[0]: secrets must not be written in the file: use "
        "${SENDDOCK_BOUNCES_MAILBOX_PASSWORD}",
        f"{path}::$.bounces.secret: must be text from the environment (${{NAME}}), not a number"]
    assert not [e for e in errors if "hunter2" in e or "1234567890" in e]
    path = write(tmp_path, "bounces:\n  secret: [\"${K1}\", \"${K2}\"]\n")
    assert errors_of(path, {"K1": "k" * 20, "K2": "hunter2"}) == [
        f"{path}::$.bounces.secret[1]: is too short: at least 16 characters (from ${{K2}})"]


def test_a_number_where_a_duration_is_expected_says_which_unit_to_add(tmp_path: Path):
    path = write(tmp_path, "recovery:\n  lease: 30\nretry:\n  schedule: [1.5, 2m]\n  max_age: 7\n")
    assert errors_of(path) == [
        f"{path}::$.recovery.lease: 30 is not a duration: add a unit, e.g. 30s",
        f"{path}::$.retry.max_age: 7 is not a duration: add a unit, e.g. 7s",
        f"{path}::$.retry.schedule[0]: 1.5 is not a duration: add a unit, e.g. 1.5s",
    ]
    path = write(tmp_path, "recovery:\n  lease: ${LEASE}\n")
    assert errors_of(path, {"LEASE": "30"}) == [
        f"{path}::$.recovery.lease: '30' is not a duration: add a unit, e.g. 30s (from ${{LEASE}})"]


def test_a_value_of_the_wrong_form_is_named_in_words_never_by_the_schema_regex(tmp_path: Path):
    path = write(tmp_path, "unsubscribe:\n  url: 127.0.0.1:8025\n  mailto: nobody\nplugins:\n  load: [my-plugin]\n"
                           "dkim:\n  domain: example.com\n  selector: .mail\n  private_key_file: k.pem\n"
                           "serve:\n  sns_topic_arns: [ses-events]\nsmtp:\n  return_path: bounces\n")
    errors = errors_of(path)
    assert [e for e in errors if "cannot import" not in e] == [
        f"{path}::$.dkim.selector: '.mail' is not a DKIM selector (letters, digits, dots, hyphens and underscores, "
        "starting with a letter or digit; e.g. mail2024)",
        f"{path}::$.plugins.load[0]: 'my-plugin' is not a dotted module path (e.g. my_plugins.audit)",
        f"{path}::$.serve.sns_topic_arns[0]: 'ses-events' is not an SNS topic ARN "
        "(e.g. arn:aws:sns:us-east-1:123456789012:ses-events)",
        f"{path}::$.smtp.return_path: 'bounces' is not an email address (e.g. bounces+{{token}}@example.com)",
        f"{path}::$.unsubscribe.mailto: 'nobody' is not an email address (e.g. unsubscribe@example.com)",
        f"{path}::$.unsubscribe.url: '127.0.0.1:8025' is not an http:// or https:// URL",
    ]
    path = write(tmp_path, "transport: ses_like\nses_like:\n  endpoint_url: localhost:4566\n")
    assert errors_of(path) == [f"{path}::$.ses_like.endpoint_url: 'localhost:4566' is not an http:// or https:// URL"]


def _patterns(schema) -> list:
    if isinstance(schema, dict):
        return [schema] * ("pattern" in schema) + [s for v in schema.values() for s in _patterns(v)]
    if isinstance(schema, list):
        return [s for v in schema for s in _patterns(v)]
    return []


def test_every_pattern_in_the_schemas_has_a_message_in_words():
    from senddock.config import base_schema
    from senddock.plugins import build_plugin_manager

    schemas = [base_schema(), *build_plugin_manager(load=[], disable=[]).config_schemas.values()]
    patterns = [s for schema in schemas for s in _patterns(schema)]
    assert len(patterns) >= 7
    assert [s["pattern"] for s in patterns if not s.get("patternMessage")] == []


def test_a_mistyped_environment_reference_is_reported_as_such_not_as_a_written_secret(tmp_path: Path):
    path = write(tmp_path, "unsubscribe:\n  secret: ${SENDDOCK_UNSUBSCRIBE_SECRET\nsmtp:\n  host: ${1HOST}.example\n"
                           "  port: ${SMTP_PORT\n")
    assert errors_of(path, {"SENDDOCK_UNSUBSCRIBE_SECRET": "s" * 20}) == [
        f"{path}::$.smtp.host: '${{1HOST}}' is not a reference to the environment: write ${{NAME}} "
        "(letters, digits and _, not starting with a digit)",
        f"{path}::$.smtp.port: unterminated ${{...}}: write ${{NAME}}",  # once, not also "not an integer"
        f"{path}::$.unsubscribe.secret: unterminated ${{...}}: write ${{NAME}}",
    ]


def test_a_secret_written_in_the_file_is_told_the_variable_the_shipped_config_uses(tmp_path: Path):
    path = write(tmp_path, "unsubscribe:\n  secret: hunter2hunter2hunter2\nsmtp:\n  password: hunter2\n")
    assert errors_of(path) == [
        f"{path}::$.smtp.password: secrets must not be written in the file: use ${{SENDDOCK_SMTP_PASSWORD}}",
        f"{path}::$.unsubscribe.secret: secrets must not be written in the file: use "
        "${SENDDOCK_UNSUBSCRIBE_SECRET}",
    ]
    shipped = (REPO / "config" / "senddock.yaml").read_text(encoding="utf-8")
    assert "secret: ${SENDDOCK_UNSUBSCRIBE_SECRET}" in shipped and "${SENDDOCK_SMTP_PASSWORD}" in shipped


def test_dsn_password_from_the_environment_is_masked_when_shown(tmp_path: Path):
    path = write(tmp_path, "database:\n  dsn: postgresql://app:${DB_PASSWORD}@db.internal/mail\n")
    config = load_config(path, environ={"DB_PASSWORD": "s3cret"})
    assert config.database.dsn == "postgresql://app:s3cret@db.internal/mail"
    shown = yaml.safe_dump(config.redacted())
    assert "s3cret" not in shown
    assert "postgresql://app:***@db.internal/mail" in shown


def test_senddock_database_url_overrides_the_dsn(tmp_path: Path):
    path = write(tmp_path, "database:\n  dsn: postgresql://db.internal/mail\n")
    config = load_config(path, environ={"SENDDOCK_DATABASE_URL": "postgresql://other/db"})
    assert config.database.dsn == "postgresql://other/db"


def test_senddock_config_names_the_file(tmp_path: Path):
    path = write(tmp_path, "workers: 2\n")
    assert find_config_path(None, {"SENDDOCK_CONFIG": str(path)}) == path
    assert find_config_path("explicit.yaml", {"SENDDOCK_CONFIG": str(path)}) == Path("explicit.yaml")


def test_lease_must_cover_three_heartbeats(tmp_path: Path):
    path = write(tmp_path, "recovery:\n  heartbeat: 10s\n  lease: 20s\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}::$.recovery.lease: must be at least three heartbeats")


def test_unknown_transport_lists_the_installed_ones(tmp_path: Path):
    path = write(tmp_path, "transport: carrier_pigeon\n")
    [error] = errors_of(path)
    assert error == (f"{path}::$.transport: 'carrier_pigeon' is not an installed transport "
                     f"(installed: {installed_transports()})")
    assert {"smtp", "ses_like"} <= set(installed_transports().split(", "))


def test_yaml_syntax_error_names_the_line(tmp_path: Path):
    path = write(tmp_path, "workers: 5\nretry: [unclosed\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}:3:")
    assert "not valid YAML" in error


def test_unreadable_file(tmp_path: Path):
    [error] = errors_of(tmp_path / "missing.yaml")
    assert "cannot read the config file" in error


def test_top_level_must_be_a_mapping(tmp_path: Path):
    [error] = errors_of(write(tmp_path, "- a\n- b\n"))
    assert "must hold a mapping" in error


def test_a_duplicated_key_is_refused_with_both_lines(tmp_path: Path):
    path = write(tmp_path, "smtp:\n  host: a.example\nworkers: 5\nsmtp:\n  host: b.example\n")
    assert errors_of(path) == [f"{path}:4: duplicate key 'smtp' (first at line 1)"]


def test_a_duplicated_key_at_any_depth_is_named_by_its_path(tmp_path: Path):
    path = write(tmp_path, "retry:\n  jitter: 0.1\nsmtp:\n  host: a\n  port: 25\n  host: b\n"
                           "plugins:\n  load: [{x: 1, x: 2}]\n")
    assert errors_of(path) == [
        f"{path}:6: duplicate key 'host' in $.smtp (first at line 4)",
        f"{path}:8: duplicate key 'x' in $.plugins.load[0] (first at line 8)",
    ]


def test_keys_that_are_the_same_value_written_differently_are_duplicates(tmp_path: Path):
    path = write(tmp_path, "workers: 5\n'workers': 6\n")
    assert errors_of(path) == [f"{path}:2: duplicate key 'workers' (first at line 1)"]


def test_a_merge_key_may_be_overridden(tmp_path: Path):
    # YAML's merge: the keys written beside `<<` win over the merged ones; that is no duplicate.
    text = "smtp:\n  <<: {host: a.example, port: 25}\n  port: 2525\n  security: none\n"
    config = load_config(write(tmp_path, text), environ={})
    assert (config.section("smtp")["host"], config.section("smtp")["port"]) == ("a.example", 2525)


def test_a_config_that_is_not_utf8_is_reported_not_raised(tmp_path: Path):
    path = tmp_path / "senddock.yaml"
    path.write_bytes("smtp:\n  host: caf\xe9\n".encode("latin-1"))
    [error] = errors_of(path)
    assert error.startswith(f"{path}:2: not UTF-8 text")


def test_a_config_from_a_pipe_resolves_relative_paths_in_the_current_directory(tmp_path: Path, monkeypatch):
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=("database:\n  embedded:\n    path: data/pg\n",))
    writer.start()
    monkeypatch.chdir(tmp_path.parent)
    try:
        config = load_config(fifo, environ={})
    finally:
        writer.join()
    assert config.folder == Path.cwd()
    assert config.database.embedded_path == Path.cwd() / "data" / "pg"


def test_a_config_under_dev_resolves_relative_paths_in_the_current_directory(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(Path("/dev/null"), environ={})
    assert config.folder == tmp_path
    assert config.database.embedded_path == tmp_path / ".senddock" / "pgdata"


def test_workers_is_the_former_name_of_concurrency(tmp_path):
    assert load_config(write(tmp_path, "workers: 7\n")).concurrency == 7
    assert load_config(write(tmp_path, "concurrency: 200\n")).concurrency == 200
    path = write(tmp_path, "concurrency: 200\nworkers: 7\n")
    assert errors_of(path) == [f"{path}::$.workers: the former name of concurrency: set concurrency alone"]
